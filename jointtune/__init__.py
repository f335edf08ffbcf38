"""jointtune: one search space for the compute tiles and the communication knobs of fused
multi-GPU kernels, tuned on all ranks at once, stored and served per kernel, shape and hardware.

The names people use come from here, as `triton.autotune` users expect:

    from jointtune import joint_autotune, ag_gemm, gemm_rs, flash_decode, create_world

They are imported on first use (module `__getattr__`), so `import jointtune` and the `jointtune`
command stay fast: nothing here imports torch, Triton or Optuna until a name that needs it is
asked for. A kernel op asked for on a machine without a GPU chooses Triton's CPU interpreter
first (it must be chosen before the first kernel is defined), so the same script runs on a GPU
node and on a laptop. To export a name, add it to `_EXPORTS` and `__all__`, and to the
`TYPE_CHECKING` block for type checkers. A built-in family's op is exported from its line in
`jointtune.families`, with nothing to add here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jointtune._lazy import lazy_exports
from jointtune._version import __version__
from jointtune.errors import JointtuneError
from jointtune.families import BUILTIN_FAMILIES

if TYPE_CHECKING:
    from jointtune.autotune.runtime.decorator import joint_autotune
    from jointtune.autotune.runtime.launcher import JointAutotuned
    from jointtune.autotune.runtime.policies import CaptureMissError
    from jointtune.autotune.runtime.rules import NoConfigError
    from jointtune.autotune.tuner.settings import TuneSettings
    from jointtune.kernels import World, create_world


#: public name -> the module that defines it (a kernel op's is under `jointtune.kernels`, which chooses Triton's CPU
#: interpreter where there is no GPU as it is imported, before Triton loads)
_EXPORTS: dict[str, str] = {
    "joint_autotune": "jointtune.autotune.runtime.decorator",
    "JointAutotuned": "jointtune.autotune.runtime.launcher",
    "NoConfigError": "jointtune.autotune.runtime.rules",
    "CaptureMissError": "jointtune.autotune.runtime.policies",
    "TuneSettings": "jointtune.autotune.tuner.settings",
    # the world the kernel families' ops run in, and each built-in family's op (`jointtune.families`)
    "create_world": "jointtune.kernels",
    "World": "jointtune.kernels",
    **{op: family.kernels for family in BUILTIN_FAMILIES for op in family.exports},
}

__all__ = [
    "CaptureMissError",
    "JointAutotuned",
    "JointtuneError",
    "NoConfigError",
    "TuneSettings",
    "World",
    "__version__",
    "create_world",
    "joint_autotune",
    *(op for family in BUILTIN_FAMILIES for op in family.exports),
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
