"""Compile the fused kernels (AG+GEMM, GEMM+RS, Flash-Decode) for Hopper (sm_90) on a machine without a GPU.

Triton's NVIDIA backend lowers to PTX and runs its bundled ptxas with no driver, so compile
failures that only a GPU run used to show (a pass pipeline that breaks on one Triton version)
are caught on the CPU, with the launcher's own arguments and constants (`standin_launches`, as the tuner's
precompile uses). The small kernels every family shares (open a call, release a chunk, wait for chunks)
are compiled once per run. A config names its family in a `family` field (ag_gemm when it has none), and may name its
problem's dims in `shape`, its dtype in `dtype` and its world size in `world_size`.

    python tests/kernels/aot_compile.py '[{"mode": "push", ...}, ...]'   # prints one line per config

Run it with another Triton first on PYTHONPATH to check that version (the GPU image's 3.6, say).
"""

from __future__ import annotations

import inspect
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile what a GPU launches: no interpreter-only upcasts

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from jointtune.kernels import get_family
from jointtune.kernels.gemm_rs.kernel import release_flag_kernel
from jointtune.kernels.runtime.ipc import ipc_barrier_kernel
from jointtune.kernels.runtime.signals import open_call_kernel, release_chunk_kernel, wait_chunks_kernel
from jointtune.search_spaces import Problem

_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
          torch.int64: "*i64"}  # fmt: skip


def config_launches(config: dict, *, M: int = 1024, N: int = 2048, K: int = 1024) -> list:
    """(kernel, arguments, options) of each Triton launch of one config: its `family` (ag_gemm if none), its
    problem's dims in `shape` (else M x N x K), `dtype` (bfloat16) and `world_size` (2)."""
    config = dict(config)
    family = get_family(config.pop("family", "ag_gemm"))
    dims = config.pop("shape", {"M": M, "N": N, "K": K})
    dtype, world_size = config.pop("dtype", "bfloat16"), config.pop("world_size", 2)
    problem = Problem.of(dims, dtype=dtype, world_size=world_size)
    return family.standin_launches(config, problem, torch.device("cpu"))


def compile_config(config: dict) -> str:
    """Compile one config's Triton kernels for sm_90; returns the PTX sizes as text, raises on failure."""
    return "; ".join(compile_kernel(kernel, named, options) for kernel, named, options in config_launches(config))


def compile_kernel(kernel, named: dict, options: dict) -> str:
    """Lower one kernel for sm_90, specialised as a launch with these arguments would be; returns a summary."""
    ptx = lower(kernel, named, options).asm["ptx"]
    vectorised = "ld.global.v4" in ptx or "cp.async.cg.shared.global" in ptx
    return f"{kernel.fn.__name__}: {len(ptx)} PTX chars, {'vectorised' if vectorised else 'scalar'} loads"


def lower(kernel, named: dict, options: dict):
    """The compiled kernel (its `asm` holds "ttgir" and "ptx") for sm_90, specialised as a launch would be."""
    names = list(inspect.signature(kernel.fn).parameters)
    const_names = {n for n, p in inspect.signature(kernel.fn).parameters.items() if "constexpr" in str(p.annotation)}
    constexprs = {n: named[n] for n in names if n in const_names}
    args = tuple(named[n] for n in names if n not in const_names)  # our kernels put every constant last
    fixed = set(getattr(kernel, "do_not_specialize", ()) or ())
    fixed |= {names[i] for i in fixed if isinstance(i, int)}
    # Specialise as a launch does: pointers (16-byte aligned) and integers divisible by 16 carry
    # tt.divisibility (vectorised loads); an integer equal to 1 becomes a constant (unit strides).
    signature, attrs = {}, {}
    for i, (name, value) in enumerate(zip(names, args)):
        if isinstance(value, torch.Tensor):
            signature[name] = _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1 and name not in fixed:
            signature[name] = "constexpr"
            constexprs[name] = 1
        else:
            signature[name] = "i32"
            if value % 16 == 0 and name not in fixed:
                attrs[(i,)] = [["tt.divisibility", 16]]
    signature.update({name: "constexpr" for name in constexprs})
    src = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
        attrs=attrs,
    )
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def shared_kernels() -> list[tuple]:
    """(kernel, arguments) of the small kernels every family shares: wait, release (with and without its wait),
    open a call, release behind the copy engine; and the barrier of ranks that share a GPU."""
    i64 = torch.zeros(1, dtype=torch.int64)
    return [
        (wait_chunks_kernel, dict(flags_ptr=i64, state_ptr=i64, rank=0, n_chunks=2, p_lo=0, p_hi=1, c_lo=0, c_hi=1)),
        (release_chunk_kernel, dict(flag_ptrs_ptr=i64, flags_ptr=i64, state_ptr=i64, rank=0, n_chunks=2, chunk=1,
                                    WORLD=2, WAIT_ALL=False)),
        (release_chunk_kernel, dict(flag_ptrs_ptr=i64, flags_ptr=i64, state_ptr=i64, rank=1, n_chunks=1, chunk=0,
                                    WORLD=4, WAIT_ALL=True)),
        (open_call_kernel, dict(state_ptr=i64, entered_ptrs_ptr=i64, entered_ptr=i64, rank=0, WORLD=2, SIGNAL=True,
                                WAIT=True)),
        (release_flag_kernel, dict(flag_ptrs_ptr=i64, state_ptr=i64, owner=1, index=3)),
        (ipc_barrier_kernel, dict(pad_ptrs_ptr=i64, rank=1, WORLD=4)),
    ]  # fmt: skip


#: the options the shared kernels launch with
SHARED_OPTIONS = dict(num_warps=1)


def _small_kernels() -> list[tuple[str, str]]:
    done = []
    for kernel, named in shared_kernels():
        try:
            done.append(("ok", compile_kernel(kernel, named, SHARED_OPTIONS)))
        except Exception as exc:
            done.append(("FAILED", f"{kernel.fn.__name__} {type(exc).__name__}: {str(exc)[-300:]}"))
    return done


def main() -> None:
    failed = 0
    for config in json.loads(sys.argv[1]):
        try:
            print(f"ok {json.dumps(config, sort_keys=True)} {compile_config(config)}", flush=True)
        except Exception as exc:  # report every config, then fail
            failed += 1
            print(f"FAILED {json.dumps(config, sort_keys=True)} {type(exc).__name__}: {str(exc)[-300:]}", flush=True)
    for status, line in _small_kernels():
        failed += status != "ok"
        print(f"{status} {line}", flush=True)
    print(f"triton {triton.__version__}: {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
