"""What the tuner, the decorator and the benchmarks need from a kernel family.

A family (`ag_gemm`, `gemm_rs`, `flash_decode`, or a test's fault-injection family) knows how to
build inputs for a problem on a world, run one config, compute the torch reference, and judge the
error. The tuner never imports a kernel module directly: it asks the registry for a family.

Example:
    >>> fam = get_family("ag_gemm")                                   # doctest: +SKIP
    >>> inputs = fam.make_inputs(problem, world, seed=0)               # doctest: +SKIP
    >>> out = fam.run(inputs, config, world)                           # doctest: +SKIP
    >>> fam.max_error(out, fam.reference(inputs)) <= fam.tolerance(problem.dtype)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jointtune.errors import UnknownNameError

if TYPE_CHECKING:
    from jointtune.kernels.world import World
    from jointtune.search_spaces import Problem


class Family(ABC):
    """One fused-kernel family: its space, its launcher, its reference and its baseline."""

    #: registry name, also the `kernel` field of keys and records
    name: str
    #: name of its joint space in `jointtune.search_spaces`
    space: str
    #: the named dims of its problem shape, in display order (e.g. ("M", "N", "K"))
    dims: tuple[str, ...]

    #: modules besides the family's own whose source is part of its version (e.g. the Triton kernel)
    source_modules: tuple[str, ...] = ()

    @functools.cached_property
    def version(self) -> str:
        """Hash of the kernel source (launcher and kernel modules): a changed kernel gets new keys,
        so records measured with the old one aren't reused."""
        import importlib

        modules = [inspect.getmodule(type(self)), *(importlib.import_module(m) for m in self.source_modules)]
        source = "\n".join(inspect.getsource(m) for m in modules)
        return hashlib.sha256(source.encode()).hexdigest()[:12]

    @abstractmethod
    def make_inputs(self, problem: Problem, world: World, *, seed: int) -> Any:
        """Fresh random inputs (never zeros) for every rank this process drives."""

    @abstractmethod
    def run(self, inputs: Any, config: Mapping[str, Any], world: World) -> Any:
        """Run one config on every rank this process drives; return the outputs."""

    @abstractmethod
    def reference(self, inputs: Any) -> Any:
        """The float32 torch reference for `inputs` (what `run` must match)."""

    @abstractmethod
    def max_error(self, outputs: Any, reference: Any) -> float:
        """Largest relative error ‖out − ref‖ / ‖ref‖ over ranks; NaN counts as infinite."""

    def tolerance(self, dtype: str) -> float:
        """Relative error allowed for `dtype` (fp32 accumulation)."""
        return {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}[dtype]

    def flops(self, problem: Problem) -> float:
        """Floating-point operations of one call summed over ranks (for reports); 0 if unknown."""
        return 0.0


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add a family to the registry (tests register fault-injecting families this way)."""
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    _FAMILIES.pop(name, None)


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        _load_builtin_families()
    try:
        return _FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(_FAMILIES)) or "none"
        raise UnknownNameError(f"kernel: {name!r} is not a known kernel family; known: {known}") from None


def family_names() -> list[str]:
    _load_builtin_families()
    return sorted(_FAMILIES)


def _load_builtin_families() -> None:
    # Imported lazily: kernel modules import triton, and the CLI should start without it.
    import importlib

    for module in ("jointtune.kernels.ag_gemm",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
