"""Fused multi-GPU Triton kernels: the runtime every family shares (`runtime/`) and one package per family
(`ag_gemm/`, `gemm_rs/`, `flash_decode/`: each its kernels, launch arguments, plans and launcher).

Only this package imports `triton.language`. On a machine with no GPU, kernels run in Triton's interpreter
(TRITON_INTERPRET=1, chosen here, as the package is imported, before Triton is: `choose_interpreter`). Importing
this package loads neither Triton nor a family: `get_family` imports a built-in family's package when first asked
(the families are listed in `jointtune.families`).
"""

from __future__ import annotations

from jointtune.kernels.runtime.device import choose_interpreter

choose_interpreter()  # before anything below imports Triton

from jointtune.kernels.runtime.family import (  # noqa: E402
    Family,
    StandinLaunch,
    family_names,
    get_family,
    register_family,
    unregister_family,
)
from jointtune.kernels.runtime.world import CudaWorld, LocalWorld, World, create_world, world_named  # noqa: E402

__all__ = [
    "CudaWorld",
    "Family",
    "LocalWorld",
    "StandinLaunch",
    "World",
    "create_world",
    "family_names",
    "get_family",
    "register_family",
    "unregister_family",
    "world_named",
]
