"""The README's REST example runs as pasted, whole: `jointtune serve` on a scratch store, a wait for /readyz,
curl, export, import, and the service stopped at the end; the user's own default store is never touched.

Only the port changes (the README's 8000 may be taken on a shared machine). The block runs under
`set -eu -o pipefail`, so any command of it that fails fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jointtune.server import TokenSet

README = Path(__file__).resolve().parents[2] / "README.md"
HARDWARE = "h200-sxm-sm90-x2-nvlink-a434a073"


def _rest_block() -> str:
    text = README.read_text()
    start = text.index("**REST**")
    return re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)


def test_the_readme_token_example_is_accepted() -> None:
    tokens = re.search(r'JOINTTUNE_TOKENS="([^"]+)"', _rest_block()).group(1)
    parsed = TokenSet.parse(tokens)
    assert len(parsed) == 2 and {parsed.role_of(t.partition(":")[2]) for t in tokens.split(",")} == {"write", "admin"}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_rest_example_runs_as_pasted(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    block = _rest_block()
    assert block.count("8000") >= 4 and "/readyz" in block and "kill $SERVER" in block
    script = "set -eu -o pipefail\n" + block.replace("8000", str(port))
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("JOINTTUNE_DB_URL", "JOINTTUNE_TOKENS")},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # jointtune on the PATH
        "XDG_DATA_HOME": str(home / ".local" / "share"),  # where the default store would be
        "HOME": str(home),
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    out = done.stdout
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"jointtune serve: listening on http://127.0.0.1:{port}" in out
    assert '"changed":true' in out  # the publish
    assert '"match":"exact"' in out and '"dtype":"bfloat16"' in out  # the lookup, by the CLI's dtype name
    assert '"trials":64' in out and '"next_after":null' in out  # provenance, the bundle page
    assert f"bundle.json: 1 record for {HARDWARE}" in out
    assert f"1 record for {HARDWARE}: 0 stored, 1 left as they were" in out
    assert not home.exists(), "the example wrote into the default store's place"
    assert not any(tmp_path.iterdir()), "the scratch directory was left behind"
    deadline = time.monotonic() + 30
    while _listening(port) and time.monotonic() < deadline:  # SIGTERM: uvicorn finishes its shutdown
        time.sleep(0.1)
    assert not _listening(port), "the example left the service running"
