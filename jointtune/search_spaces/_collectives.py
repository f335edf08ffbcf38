"""The unfused path's collective as a knob of `mode=baseline`: the best unfused path is the fastest collective the build
offers, not NCCL's default, and which one wins depends on the size (bench/results/collectives_*).

- `nccl`: NCCL's default kernels on ordinary tensors;
- `nccl_symm`: NCCL's symmetric kernels (`ncclSymk*`), on buffers in a memory pool registered with the communicator as
  a symmetric window (torch's ProcessGroupNCCL.register_mem_pool(pool, symm=True); no `set_backend`, so it shares a
  process with our own symmetric memory);
- `nccl_ce`: NCCL's copy-engine all-gather (a communicator with the zero-CTA policy, on window buffers); offered only
  with JOINTTUNE_NCCL_CE=1, as NCCL 2.28.9 under torch 2.11 failed it on H200 (`hardware.available_collectives`);
- `torch_two_shot` / `torch_one_shot`: torch's symmetric-memory all-reduces (all-reduce only).

Which ones a device can run is part of its limits (`DeviceLimits.collectives`); a config asking for another is
refused by name, never a crash at its first call.
"""

from __future__ import annotations

from collections.abc import Mapping

from jointtune.search_spaces._params import Constraint, Context, Param, Value, categorical, when

#: every collective variant any family offers, in a fixed order (the context carries them as a bit mask)
COLLECTIVES = ("nccl", "nccl_symm", "nccl_ce", "torch_two_shot", "torch_one_shot")
ALL_GATHER = ("nccl", "nccl_symm", "nccl_ce")
REDUCE_SCATTER = ("nccl", "nccl_symm")
ALL_REDUCE = ("nccl", "nccl_symm", "torch_two_shot", "torch_one_shot")

#: what a build needs for each variant, as an error message says it
NEEDS = {
    "nccl": "NCCL",
    "nccl_symm": "NCCL >= 2.27 and torch's ProcessGroupNCCL.register_mem_pool(pool, symm=True) (torch >= 2.9)",
    "nccl_ce": "NCCL >= 2.28, the cta_policy field in torch's NCCL config, and JOINTTUNE_NCCL_CE=1 (NCCL 2.28.9's "
    "copy-engine all-gather failed under torch 2.11 on H200)",
    "torch_two_shot": "torch.ops.symm_mem.two_shot_all_reduce_",
    "torch_one_shot": "torch.ops.symm_mem.one_shot_all_reduce",
}


def collective_mask(names: tuple[str, ...]) -> int:
    """The variants `names` as a bit mask over COLLECTIVES (what a space's context holds)."""
    return sum(1 << COLLECTIVES.index(n) for n in names if n in COLLECTIVES)


def collective_param(choices: tuple[str, ...], what: str) -> Param:
    return categorical(
        "collective",
        choices,
        when=when(mode="baseline"),
        doc=f"baseline: which {what} runs (NCCL's default or symmetric kernels, the copy engine, ...)",
        implied="nccl",  # what {"mode": "baseline"} meant before the knob existed
    )


def collective_available(choices: tuple[str, ...]) -> Constraint:
    """Refuses a variant of `choices` this device's build can't run, naming what it needs and what is allowed."""

    def check(cfg: Mapping[str, Value], ctx: Context) -> str | None:
        name = str(cfg["collective"])
        mask = ctx["collectives"]
        if mask >> COLLECTIVES.index(name) & 1:
            return None
        allowed = ", ".join(f'"{n}"' for n in choices if mask >> COLLECTIVES.index(n) & 1)
        return f'collective: "{name}" is not available on this device (needs {NEEDS[name]}); allowed: {allowed}'

    return Constraint("collective_available", ("collective",), "collective is one the device's build runs", check)
