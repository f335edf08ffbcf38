"""What the benchmarks share: the CUDA world and GPU timing (`cuda`), how a modes benchmark measures and saves
(`measure`), the crash- and hang-proof harness (`harness`), running against another checkout (`checkout`), and the
device scripts' environment (`device_env.sh`).

A script runs as a file (`torchrun ... bench/gemm_rs/gemm_rs_modes.py`), so it first puts `bench/` on `sys.path`;
its folders then import as packages (`from common.measure import run_header`, `from flash_decode.flash_decode_modes
import FdRig`). Importing this package puts this checkout first on the path too, so the `jointtune` a script imports
is the one beside it (`checkout`'s `--tree` names another).
"""

import sys
from pathlib import Path

_CHECKOUT = str(Path(__file__).resolve().parents[2])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
