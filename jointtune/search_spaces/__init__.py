"""Declarative joint search spaces over compute tiles and communication knobs, one per family.

Example:
    >>> from jointtune.search_spaces import DeviceLimits, get_space
    >>> space = get_space("ag_gemm")
    >>> problem = space.make_problem("M=8192,N=4096,K=12288", dtype="bf16", world_size=2)
    >>> space.default(problem, DeviceLimits.nominal_hopper())
    {'mode': 'push_cublas', 'push_by': 'ce', 'gemm_order': 'local_first', 'chunk_m': 2048}
"""

from jointtune.families import BUILTIN_FAMILIES
from jointtune.search_spaces._anchors import ANCHOR_DTYPE, ANCHOR_WORLD_SIZE, ANCHORS, anchor_problems
from jointtune.search_spaces._config import canonical_json, config_hash
from jointtune.search_spaces._gemm import row_tile
from jointtune.search_spaces._params import (
    Condition,
    Constraint,
    Context,
    Param,
    Value,
    categorical,
    cdiv,
    choice,
    format_choices,
    format_value,
    next_pow2,
    pow2,
    rule_field,
    when,
)
from jointtune.search_spaces._problem import DTYPE_BYTES, DeviceLimits, Problem, normalize_dtype
from jointtune.search_spaces._registry import get_space, register_space, space_names, unregister_space
from jointtune.search_spaces._shape import parse_shape
from jointtune.search_spaces._space import Space
from jointtune.search_spaces.ag_gemm import AG_GEMM
from jointtune.search_spaces.flash_decode import FLASH_DECODE
from jointtune.search_spaces.gemm_rs import GEMM_RS

for _family in BUILTIN_FAMILIES:  # every built-in family's space, from the one table of them
    register_space(_family.load_space())

__all__ = [
    "AG_GEMM",
    "ANCHORS",
    "ANCHOR_DTYPE",
    "ANCHOR_WORLD_SIZE",
    "DTYPE_BYTES",
    "FLASH_DECODE",
    "GEMM_RS",
    "Condition",
    "Constraint",
    "Context",
    "DeviceLimits",
    "Param",
    "Problem",
    "Space",
    "Value",
    "anchor_problems",
    "canonical_json",
    "categorical",
    "cdiv",
    "choice",
    "config_hash",
    "format_choices",
    "format_value",
    "get_space",
    "next_pow2",
    "normalize_dtype",
    "parse_shape",
    "pow2",
    "register_space",
    "row_tile",
    "rule_field",
    "space_names",
    "unregister_space",
    "when",
]
