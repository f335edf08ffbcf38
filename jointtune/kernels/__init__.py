"""Fused multi-GPU Triton kernels, one module per family, and the world they run in.

Only this package imports `triton.language`. On a machine with no GPU, kernels run in Triton's
interpreter (TRITON_INTERPRET=1, chosen before the first kernel is defined).
"""

from __future__ import annotations

from jointtune.kernels._family import Family, family_names, get_family, register_family, unregister_family

__all__ = ["Family", "family_names", "get_family", "register_family", "unregister_family"]
