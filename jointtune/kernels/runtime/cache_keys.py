"""The same Triton cache keys in every process, whatever it compiled first (Triton 3.6 and earlier).

A kernel's on-disk cache key includes its function's `cache_key`: a hash of its source, of the functions it calls
and of the constexpr globals they use. Triton up to 3.6 merges a called function's used globals *before* computing
that function's key (`DependenciesFinder._update_hash`), so a helper hashed for the first time from inside a caller
contributes none of them. The key then depends on which kernel the process hashed first: `push_rows`, which both
`ag_gemm_kernel` and `allgather_push_kernel` call, hashes differently when `allgather_push_kernel` came first, and so
does `ag_gemm_kernel`. A compile worker and a rank that compiled in other orders wrote and looked up different keys
(4x H100, Triton 3.6: only the worker whose first kernel was `allgather_push_kernel` left entries the ranks found).
Later Tritons compute the called function's key first; there every order gives these keys already.

`settle_cache_keys` hashes every loaded kernel function of ours again, callees before callers, so each merge sees
the callee's globals: the keys a process then compiles under depend on the kernels' code only.

Example:
    >>> settle_cache_keys()   # after importing kernel modules, before compiling  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import sys
from typing import Any

#: the packages whose Triton functions are ours to hash again (a plug-in family's kernels keep Triton's order)
PREFIX = "jointtune.kernels"


def _jit_functions() -> list[Any]:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: nothing compiles
        return []
    seen: dict[int, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == PREFIX or name.startswith(PREFIX + ".")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, JITFunction):
                seen.setdefault(id(value), value)
    return sorted(seen.values(), key=lambda f: (f.fn.__module__, f.fn.__qualname__))


def _callees(fn: Any, known: dict[int, Any]) -> list[Any]:
    """The functions of ours that `fn`'s body names (globals that are kernel functions), in source order."""
    try:
        tree = fn.parse()
    except Exception:  # source not at hand: Triton hashes it as it can
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            value = fn.__globals__.get(node.id)
            if value is not None and id(value) in known and value is not fn:
                out.append(value)
    return out


#: functions already settled in this process (by id): never hashed again, so a family registered later (a plug-in, a
#: test's) never resets a key a compile on another thread may be reading; their keys are complete, so a new caller's
#: hash merges their globals in full
_SETTLED: set[int] = set()


def settle_cache_keys() -> int:
    """Hash every loaded kernel function of ours not settled yet again, callees first (see the module docstring);
    returns how many. Call it after importing kernel modules and before compiling; compiles already done keep their
    kernels."""
    fns = [f for f in _jit_functions() if id(f) not in _SETTLED]
    known = {id(f): f for f in fns}
    for f in fns:
        f.hash = None
    done: set[int] = set(_SETTLED)
    active: set[int] = set()

    def visit(f: Any) -> None:
        if id(f) in done or id(f) in active:  # a cycle: Triton's own placeholder breaks it
            return
        active.add(id(f))
        for callee in _callees(f, known):
            visit(callee)
        active.discard(id(f))
        _ = f.cache_key
        done.add(id(f))

    for f in fns:
        visit(f)
    _SETTLED.update(known)
    return len(fns)
