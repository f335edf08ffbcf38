"""The README's REST example runs as written: its tokens, `jointtune serve`, curl, export and import.

Only the port changes (the README's 8000 may be taken on a shared machine), and the script waits
for the service to answer before its first request, as a person typing it does.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jointtune.server import TokenSet

README = Path(__file__).resolve().parents[2] / "README.md"


def _rest_block() -> str:
    text = README.read_text()
    start = text.index("**REST**")
    return re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)


def test_the_readme_token_example_is_accepted() -> None:
    tokens = re.search(r'JOINTTUNE_TOKENS="([^"]+)"', _rest_block()).group(1)
    parsed = TokenSet.parse(tokens)
    assert len(parsed) == 2 and {parsed.role_of(t.partition(":")[2]) for t in tokens.split(",")} == {"write", "admin"}


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_rest_example_runs_as_written(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    block = _rest_block().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    block = block.replace("jointtune serve &\n", f"jointtune serve --port {port} &\n")
    wait = f"for i in $(seq 1 600); do curl -sf http://127.0.0.1:{port}/readyz >/dev/null && break; sleep 0.1; done\n"
    serve_line = f"jointtune serve --port {port} &\n"
    assert serve_line in block
    script = "trap 'kill $(jobs -p) 2>/dev/null' EXIT\n" + block.replace(serve_line, serve_line + wait)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "JOINTTUNE_DB_URL": f"sqlite:///{tmp_path / 'readme.db'}",
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    env.pop("JOINTTUNE_TOKENS", None)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"changed":true' in out  # the publish
    assert '"match":"exact"' in out and '"dtype":"bfloat16"' in out  # the lookup, by the CLI's dtype name
    assert '"next_after":null' in out  # the bundle page
    assert "bundle.json: 1 records for h200-sxm-sm90-x2-nvlink-a434a073" in out
    assert "1 records for h200-sxm-sm90-x2-nvlink-a434a073: 0 stored, 1 kept the existing better record" in out
