"""Fused multi-GPU Triton kernels, one module per family, and the world they run in.

Only this package imports `triton.language`. On a machine with no GPU, kernels run in Triton's
interpreter (TRITON_INTERPRET=1, chosen here, as the package is imported, before Triton is: `choose_interpreter`).
"""

from __future__ import annotations

from jointtune.kernels.runtime.device import choose_interpreter

choose_interpreter()  # before anything below imports Triton

from jointtune.kernels.runtime.family import Family, family_names, get_family, register_family, unregister_family  # noqa: E402

__all__ = ["Family", "family_names", "get_family", "register_family", "unregister_family"]
