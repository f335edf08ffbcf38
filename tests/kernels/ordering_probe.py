"""Memory-ordering facts of the fused kernels as compiled for Hopper (sm_90), found without a GPU.

Two faults that only a GPU showed, as wrong sums now and then, are visible in what Triton emits:

- a flag wait whose acquire was folded away (Triton drops a scalar `atomic_add(p, 0)` whose result is
  unused): the PTX then polls with volatile loads and never acquires;
- a read-then-zero of an fp32 buffer with no barrier between: Triton may lay the zeroing store out
  over other threads than the read, so one thread zeroes what another has not read yet.

And the rule that makes one thread's release or acquire speak for its whole program (`signals`' doc): a
scalar release (or acq_rel count) must come after a barrier that follows the program's tensor stores and
atomics, and the tensor loads after a scalar acquire must come after a barrier that follows it. A release made of
a system-scope fence and relaxed flag writes (GEMM+AR) needs the barrier before the fence, and the fence before
every relaxed flag write.

    python tests/kernels/ordering_probe.py '[{"family": "gemm_rs", "mode": "atomic", ...}, ...]'

prints one JSON line per compiled kernel: its spins (volatile polling loads), acquiring reads of an int64
flag, the zeroing stores not preceded by a barrier, the handoffs without their barrier, and its system-scope CAS
(the barrier exchange's meetings) with whether each result reaches every thread. Configs are given as
for `aot_compile.py`.
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
from ttgir_checks import unbarriered_handoffs, unfenced_flag_writes, unfenced_zeroing

_FLAG_ACQUIRE = re.compile(r"\b(ld|atom)\.global\.\S*acquire\S*\.[bsu]64\b")  # flags and epochs are int64
_SYS_CAS = re.compile(r"\batom\.global\.(\w+)\.sys\.cas\.b32\s+(%r\d+),")


def sys_cas(instructions: list[str]) -> list[list]:
    """[semantics, handed out] of every system-scope CAS (the barrier exchange's meetings, `gemm_ar.meet`): handed
    out when its result goes through shared memory and a barrier before any thread reads it. A CAS on a vector has
    each element in several threads and only one of them performs it; were the others to read a register of their
    own, warps would leave the spin loop apart and meet different barriers (a hang)."""
    out = []
    for i, line in enumerate(instructions):
        found = _SYS_CAS.search(line)
        if not found:
            continue
        sem, reg = found.groups()
        stored = re.compile(r"\bst\.shared\S*\s+\[[^\]]*\],\s*" + re.escape(reg) + ";")  # st.shared(::cta).b32
        st = bar = ld = -1
        for j, x in enumerate(instructions[i + 1 : i + 8]):
            if st < 0 and stored.search(x):
                st = j
            elif bar < 0 and x.startswith("bar.sync"):
                bar = j
            elif ld < 0 and x.startswith("ld.shared"):
                ld = j
        out.append([sem, 0 <= st < bar < ld])
    return out


def facts(name: str, compiled) -> dict:
    ptx = compiled.asm["ptx"]
    instructions = [ln.strip() for ln in ptx.splitlines() if not ln.strip().startswith("//")]
    return {
        "kernel": name,
        "spins": sum("ld.volatile.global" in ln for ln in instructions),
        "flag_acquires": sum(bool(_FLAG_ACQUIRE.search(ln)) for ln in instructions),
        "unfenced_zeroing": unfenced_zeroing(compiled.asm["ttgir"]),
        "unbarriered_handoffs": unbarriered_handoffs(compiled.asm["ttgir"]),
        "unfenced_flag_writes": unfenced_flag_writes(compiled.asm["ttgir"]),
        "sys_fences": sum(ln.startswith("fence.acq_rel.sys") for ln in instructions),
        "sys_cas": sys_cas(instructions),
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
