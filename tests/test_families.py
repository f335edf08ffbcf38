"""The one table of built-in families (`jointtune.families`) feeds the space registry, the family registry and the
root's exports, so a built-in family is its packages and one line there."""

from __future__ import annotations

import importlib

import jointtune
from jointtune.families import BUILTIN_FAMILIES, BuiltinFamily
from jointtune.kernels import family_names, get_family
from jointtune.search_spaces import get_space, space_names


def test_every_line_of_the_table_is_a_registered_space_a_registered_family_and_an_exported_op() -> None:
    assert [f.name for f in BUILTIN_FAMILIES] == ["ag_gemm", "gemm_rs", "flash_decode", "gemm_ar"]
    for line in BUILTIN_FAMILIES:
        assert get_space(line.name) is line.load_space() and line.name in space_names()
        family = get_family(line.name)
        assert (family.name, family.space) == (line.name, line.name) and line.name in family_names()
        assert type(family).__module__.startswith(line.kernels + ".")
        for op in line.exports:
            assert op in jointtune.__all__
            assert getattr(jointtune, op) is getattr(importlib.import_module(line.kernels), op)


def test_a_line_names_its_module_and_package_by_convention() -> None:
    line = BuiltinFamily("gemm_ar", space="GEMM_AR", ops=("gemm_ar_rmsnorm",))
    assert (line.space_module, line.kernels) == ("jointtune.search_spaces.gemm_ar", "jointtune.kernels.gemm_ar")
    assert line.exports == ("gemm_ar", "gemm_ar_rmsnorm")
