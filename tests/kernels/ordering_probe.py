"""Memory-ordering facts of the fused kernels as compiled for Hopper (sm_90), found without a GPU.

Two faults that only a GPU showed, as wrong sums now and then, are visible in what Triton emits:

- a flag wait whose acquire was folded away (Triton drops a scalar `atomic_add(p, 0)` whose result is
  unused): the PTX then polls with volatile loads and never acquires;
- a read-then-zero of an fp32 buffer with no barrier between: Triton may lay the zeroing store out
  over other threads than the read, so one thread zeroes what another has not read yet.

    python tests/kernels/ordering_probe.py '[{"family": "gemm_rs", "mode": "atomic", ...}, ...]'

prints one JSON line per compiled kernel: its spins (volatile polling loads), acquiring reads of an int64
flag, and the zeroing stores not preceded by a barrier. Configs are given as for `aot_compile.py`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aot_compile import SHARED_OPTIONS, config_launches, lower, shared_kernels  # first: it turns the interpreter off

# isort: split

import triton

_ZERO_CONST = re.compile(r"^\s*(%[\w.]+) = arith\.constant dense<0\.000000e\+00> : tensor<[\dx]+xf32")
_STORE = re.compile(r"^\s*tt\.store (%[\w.]+), (%[\w.]+)")
_FLAG_ACQUIRE = re.compile(r"\b(ld|atom)\.global\.\S*acquire\S*\.[bsu]64\b")  # flags and epochs are int64
_BARRIER = re.compile(r"\b(gpu\.barrier|ttg\.barrier)\b")  # `tl.debug_barrier()` in Triton 3.6 / 3.9
_F32_READ = re.compile(r"tt\.(load|atomic_rmw)\b.*tensor<[\dx]+x!tt\.ptr<f32>")


def unfenced_zeroing(ttgir: str) -> list[str]:
    """Stores of an fp32 zeros constant whose nearest earlier fp32 tensor read (in program text) comes
    after the nearest barrier, i.e. a zeroing that may overtake another thread's read."""
    lines = ttgir.splitlines()
    zeros = {m.group(1) for line in lines if (m := _ZERO_CONST.match(line))}
    bad = []
    for i, line in enumerate(lines):
        store = _STORE.match(line)
        if not store or store.group(2) not in zeros:
            continue
        for earlier in reversed(lines[:i]):
            if _BARRIER.search(earlier):
                break
            if _F32_READ.search(earlier):
                bad.append(line.strip()[:160])
                break
    return bad


def facts(name: str, compiled) -> dict:
    ptx = compiled.asm["ptx"]
    instructions = [ln.strip() for ln in ptx.splitlines() if not ln.strip().startswith("//")]
    return {
        "kernel": name,
        "spins": sum("ld.volatile.global" in ln for ln in instructions),
        "flag_acquires": sum(bool(_FLAG_ACQUIRE.search(ln)) for ln in instructions),
        "unfenced_zeroing": unfenced_zeroing(compiled.asm["ttgir"]),
    }


def config_facts(config: dict) -> list[dict]:
    return [
        facts(kernel.fn.__name__, lower(kernel, named, options)) for kernel, named, options in config_launches(config)
    ]


def shared_kernel_facts() -> list[dict]:
    return [facts(kernel.fn.__name__, lower(kernel, named, SHARED_OPTIONS)) for kernel, named in shared_kernels()]


def main() -> None:
    print(json.dumps({"triton": triton.__version__}), flush=True)
    for config in json.loads(sys.argv[1]):
        for fact in config_facts(config):
            print(json.dumps({"config": config, **fact}), flush=True)
    for fact in shared_kernel_facts():
        print(json.dumps({"config": None, **fact}), flush=True)


if __name__ == "__main__":
    main()
