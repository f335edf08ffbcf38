"""The built-in kernel families, in one table: it feeds the search-space registry (`jointtune.search_spaces`), the
kernel-family registry (`jointtune.kernels.get_family`) and the ops the package exports (`from jointtune import
ag_gemm`). Adding a built-in family is its kernel package, its space module and one line here.

A family's name is also its space's, its op's (a function of that name in its kernel package) and its torch op's
(`torch.ops.jointtune.<name>`). This module imports nothing, so every part of the package can read the table
without loading torch or Triton.

Example:
    >>> [family.name for family in BUILTIN_FAMILIES]
    ['ag_gemm', 'gemm_rs', 'flash_decode', 'gemm_ar']
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BuiltinFamily:
    """One built-in family: its name and its `Space`'s name in its space module, `jointtune.search_spaces.<name>`; its
    kernel package is `jointtune.kernels.<name>` (its launcher registers the family; it exports the op `<name>`, and
    `ops` names any other op of the package the root exports too, such as a second form of the same kernel)."""

    name: str
    space: str
    ops: tuple[str, ...] = ()

    @property
    def exports(self) -> tuple[str, ...]:
        """The ops `from jointtune import ...` finds in this family's kernel package."""
        return (self.name, *self.ops)

    @property
    def space_module(self) -> str:
        return f"jointtune.search_spaces.{self.name}"

    @property
    def kernels(self) -> str:
        return f"jointtune.kernels.{self.name}"

    def load_space(self) -> Any:
        """The family's `Space` (imports its space module)."""
        return getattr(importlib.import_module(self.space_module), self.space)


BUILTIN_FAMILIES: tuple[BuiltinFamily, ...] = (
    BuiltinFamily("ag_gemm", space="AG_GEMM"),
    BuiltinFamily("gemm_rs", space="GEMM_RS"),
    BuiltinFamily("flash_decode", space="FLASH_DECODE"),
    BuiltinFamily("gemm_ar", space="GEMM_AR", ops=("gemm_ar_rmsnorm",)),
)
