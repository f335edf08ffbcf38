"""What every built-in family's space shares: its kernels run bfloat16 and float16, and the collective of its unfused
path (the `collective` knob of `mode=baseline`, declared with `collective_param`) is refused where this device's build
can't run it, the space's last rule (`collective_available`, over the knob's own choices: declared once).

Example:
    >>> from jointtune.search_spaces import get_space
    >>> get_space("gemm_ar").constraints[-1].name, get_space("gemm_ar").dtypes
    ('collective_available', ('bfloat16', 'float16'))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jointtune.errors import SpaceError
from jointtune.search_spaces._collectives import collective_available
from jointtune.search_spaces._params import Constraint, Param
from jointtune.search_spaces._space import Space

#: the element types every built-in family's kernels run
FAMILY_DTYPES = ("bfloat16", "float16")


def family_space(name: str, *, params: Sequence[Param], constraints: Sequence[Constraint], **kwargs: Any) -> Space:
    """A built-in family's `Space` (`kwargs` are the rest of `Space`'s arguments): its dtypes, and after its
    `constraints` the availability rule of its `collective` param's choices."""
    collective = next((p for p in params if p.name == "collective"), None)
    if collective is None:
        raise SpaceError(f"{name}: a family's space needs a `collective` param (collective_param) for its baseline")
    rules = [*constraints, collective_available(tuple(str(c) for c in collective.choices))]
    return Space(name, params=params, constraints=rules, dtypes=FAMILY_DTYPES, **kwargs)
