"""The family contract: what the tuner, the decorator, the benchmarks and the torch ops need of a kernel family.

A family (`ag_gemm`, `gemm_rs`, `flash_decode`, or a test's fault-injection family) knows how to build
inputs for a problem on a world, run one config (its launcher), compute the float32 reference, run the
unfused baseline, turn a call's arguments into its key (the problem shape), and compile a config's
Triton kernels ahead of its first launch (`standin_launches`, launched nowhere). The tuner never imports
a kernel module directly: it asks the registry for a family.

Example:
    >>> fam = get_family("ag_gemm")                                   # doctest: +SKIP
    >>> inputs = fam.make_inputs(problem, world, seed=0)               # doctest: +SKIP
    >>> out = fam.run(inputs, config, world)                           # doctest: +SKIP
    >>> fam.max_error(out, fam.reference(inputs)) <= fam.tolerance(problem.dtype)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jointtune.errors import UnknownNameError, registered

if TYPE_CHECKING:
    import torch

    from jointtune.kernels.runtime.world import World
    from jointtune.search_spaces import Problem

#: (kernel, arguments by name, launch options) of one Triton launch a config makes
StandinLaunch = tuple[Any, dict[str, Any], dict[str, Any]]


class Family(ABC):
    """One fused-kernel family: its space, its launcher, its reference and its baseline."""

    #: registry name, also the `kernel` field of keys and records
    name: str
    #: name of its joint space in `jointtune.search_spaces`
    space: str
    #: the named dims of its problem shape, in display order (e.g. ("M", "N", "K"))
    dims: tuple[str, ...]

    @functools.cached_property
    def version(self) -> str:
        """Hash of the source of the family's module and of every module of `jointtune.kernels` (and of its own
        package) that it imports, directly or not (`jointtune.kernels.runtime.version`): a changed kernel, launcher or
        shared runtime module gets new keys, so records measured on the old code aren't served."""
        from jointtune.kernels.runtime.version import closure_version

        return closure_version(type(self).__module__)

    @abstractmethod
    def make_inputs(self, problem: Problem, world: World, *, seed: int) -> Any:
        """Fresh random inputs (never zeros) for every rank this process drives."""

    @abstractmethod
    def run(self, inputs: Any, config: Mapping[str, Any], world: World) -> Any:
        """The launcher: run one config on every rank this process drives; return the outputs."""

    @abstractmethod
    def reference(self, inputs: Any) -> Any:
        """The float32 torch reference for `inputs` (what `run` must match)."""

    def baseline(self, inputs: Any, world: World) -> Any:
        """The unfused path (NCCL collective + cuBLAS/torch); a family's space holds it as `mode=baseline`."""
        return self.run(inputs, {"mode": "baseline"}, world)

    def key(self, *args: Any, world: World, **kwargs: Any) -> dict[str, int]:
        """The problem shape (global dims) of a launcher call: what configs are stored and looked up under."""
        raise UnknownNameError(f"kernel: family {self.name!r} has no key function; pass key= to the decorator")

    def stored_problem(self, problem: Problem) -> Problem:
        """The problem a tuned record of `problem` is stored under: the shape `key` gives a call of that problem,
        so a tuned record is found at run time (the space's rule: identity unless it buckets a dim)."""
        from jointtune.search_spaces import get_space

        return get_space(self.space).stored_problem(problem)

    def max_error(self, outputs: Sequence[Any], reference: Sequence[Any]) -> float:
        """Largest relative error ‖out − ref‖ / ‖ref‖ over ranks; NaN counts as infinite."""
        worst = 0.0
        for out, ref in zip(outputs, reference):
            err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            worst = max(worst, err if err == err else float("inf"))
        return worst

    def tolerance(self, dtype: str) -> float:
        """Relative error allowed for `dtype` (fp32 accumulation)."""
        return {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}[dtype]

    def flops(self, problem: Problem) -> float:
        """Floating-point operations of one call summed over ranks (for reports); 0 if unknown."""
        return 0.0

    def standin_launches(
        self, config: Mapping[str, Any], problem: Problem, device: torch.device
    ) -> list[StandinLaunch]:
        """The Triton launches a call of `config` makes, with 1-element stand-in tensors and the call's
        real integers: compiles specialise on dtypes, on integers divisible by 16 and on pointer
        alignment, so these compile what a call will launch. Families without Triton kernels: none."""
        return []

    def precompile(self, config: Mapping[str, Any], problem: Problem) -> None:
        """Compile `config`'s Triton kernels before its first launch (tuners call this on a thread pool)."""
        from jointtune.kernels.runtime.device import interpreted

        if interpreted():
            return
        import torch

        device = torch.device("cuda", torch.cuda.current_device())
        for kernel, args, options in self.standin_launches(config, problem, device):
            kernel.warmup(grid=(1,), **args, **options)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add a family to the registry (tests register fault-injecting families this way). Its kernel modules are loaded
    by now: their Triton cache keys are settled, the same in every process (`cache_keys`)."""
    from jointtune.kernels.runtime.cache_keys import settle_cache_keys

    _FAMILIES[family.name] = family
    settle_cache_keys()
    return family


def unregister_family(name: str) -> None:
    _FAMILIES.pop(name, None)


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        _load_builtin_families()
    return registered(_FAMILIES, name, "kernel: {name} is not a known kernel family")


def family_names() -> list[str]:
    _load_builtin_families()
    return sorted(_FAMILIES)


def _load_builtin_families() -> None:
    # Imported lazily: kernel modules import triton, and the CLI should start without it.
    import importlib

    from jointtune.families import BUILTIN_FAMILIES

    for family in BUILTIN_FAMILIES:
        try:
            importlib.import_module(family.kernels)
        except ModuleNotFoundError as exc:
            if exc.name != family.kernels:
                raise
