"""Names a package exports lazily: `from jointtune import ag_gemm` imports only the module that defines the name,
on first use, so `import jointtune` and light users (the service, the CLI's `hw`) don't pay for torch, Triton or
Optuna they don't use. A kernel op's module is under `jointtune.kernels`, whose `__init__` (run first, as every
parent package's is) chooses Triton's CPU interpreter where there is no GPU, before Triton loads.

Example (a package's `__init__`):
    >>> _EXPORTS = {"detect": "jointtune.hardware", "Job": "tuner.settings"}            # doctest: +SKIP
    >>> __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)    # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], namespace: MutableMapping[str, Any],
                 names: Sequence[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:  # fmt: skip
    """The module `__getattr__` and `__dir__` of `package`: `exports` maps a public name to the module defining it
    (a full name, or one relative to `package`); a name looked up once is kept in `namespace` (the package's
    globals), so later lookups skip `__getattr__`."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path = module if module.startswith("jointtune.") else f"{package}.{module}"
        value = getattr(importlib.import_module(path), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
