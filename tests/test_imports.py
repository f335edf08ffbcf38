"""The package's import graph: no module cycle, and no private import across packages.

Read from the source (ast), so imports inside functions count too: a cycle hidden by a function-level
import (as `decorator` <-> `triton_compat` once was) still fails here. Imports under `if TYPE_CHECKING:`
never run, so they make no edge of the graph, but they must still use public names.

A name or module is private when it starts with one underscore (`jointtune.db._url`, `_is_count`); only
its own package and that package's subpackages may import it. Other packages use what the package
exports: `from jointtune.db import redact_url`, not `from jointtune.db._url import redact_url`. Names a
package exports lazily (a literal `_EXPORTS` dict in its `__init__`) are followed to the module that
defines them.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import jointtune

ROOT = Path(jointtune.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("jointtune", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The package a module belongs to (a package's `__init__` belongs to the package itself)."""
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _private_owner(target: str) -> str | None:
    """The package a private module path belongs to ('jointtune.db' for 'jointtune.db._url'), else None."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _lazy_exports(package: str) -> dict[str, str]:
    """name -> defining module, for a package whose `__init__` keeps an `_EXPORTS` dict (name -> module, or name ->
    (module, flag)); read from the imported package, which such an `__init__` keeps light (lazy exports)."""
    if "_EXPORTS" not in MODULES[package].read_text():
        return {}
    exports = getattr(importlib.import_module(package), "_EXPORTS", {})
    out = {}
    for name, value in exports.items():
        module = value[0] if isinstance(value, tuple) else value
        out[name] = module if module.startswith("jointtune") else f"{package}.{module}"
    return out


def _imports(module: str) -> Iterator[tuple[int, str, str | None, bool]]:
    """(line, target module, imported name or None, runs: False inside `if TYPE_CHECKING:`)."""
    tree = ast.parse(MODULES[module].read_text())
    package = _package(module)

    def walk(node: ast.AST, runs: bool) -> Iterator[tuple[int, str, str | None, bool]]:
        for child in ast.iter_child_nodes(node):
            type_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("jointtune"):
                        yield child.lineno, alias.name, None, runs
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                if base.startswith("jointtune"):
                    for alias in child.names:
                        sub = f"{base}.{alias.name}"
                        if sub in MODULES:  # `from package import module`
                            yield child.lineno, sub, None, runs
                        else:
                            defined = _lazy_exports(base).get(alias.name, base) if base in MODULES else base
                            yield child.lineno, defined, alias.name, runs
            yield from walk(child, runs and not type_only)

    yield from walk(tree, True)


def _graph() -> dict[str, set[str]]:
    """module -> the modules it imports when it runs (at import time or inside a function)."""
    return {m: {t for _, t, _, runs in _imports(m) if runs and t != m and t in MODULES} for m in MODULES}


def test_the_scanner_sees_the_package() -> None:
    """The two tests below pass vacuously if the scanner finds nothing: check it finds what we know is there."""
    known = {"jointtune.autotune.runtime.decorator", "jointtune.autotune.runtime.rules", "jointtune.db._url"}
    assert known <= set(MODULES)
    graph = _graph()
    assert "jointtune.autotune.runtime.launcher" in graph["jointtune.autotune.runtime.decorator"]
    # a function-level import is an edge; a TYPE_CHECKING one is not
    assert "jointtune.autotune.runtime.triton_compat" in graph["jointtune.autotune.runtime.decorator"]
    assert "jointtune.autotune.tuner.settings" not in graph["jointtune.autotune.runtime.decorator"]
    # lazy exports are followed to the module that defines the name
    assert _lazy_exports("jointtune.autotune")["detect"] == "jointtune.hardware"
    assert _lazy_exports("jointtune")["NoConfigError"] == "jointtune.autotune.runtime.rules"
    assert _private_owner("jointtune.db._url") == "jointtune.db" and _private_owner("jointtune.db") is None


def test_no_private_import_crosses_a_package_boundary() -> None:
    bad = []
    for module, path in MODULES.items():
        here = _package(module)
        for line, target, name, _ in _imports(module):
            owner = _private_owner(target)
            if owner is None and name and name.startswith("_") and not name.startswith("__"):
                owner = _package(target) if target in MODULES else target
            if owner is not None and not (here == owner or here.startswith(owner + ".")):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}{':' + name if name else ''}")
    assert not bad, "private imports across packages (export the name from its package):\n" + "\n".join(bad)


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles (move what both sides need into a module of its own):\n" + "\n".join(cycles)


def test_autotune_is_three_rooms_with_no_loose_module() -> None:
    root = ROOT / "autotune"
    entries = sorted(p.name for p in root.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py"))
    assert entries == ["__init__.py", "runtime", "tuner", "workers"]


def test_the_rooms_import_each_other_only_as_their_docstrings_say() -> None:
    """The tuner imports neither other room; the run-time path reaches the workers through one entry point."""
    reached: dict[str, set[str]] = {"runtime": set(), "tuner": set()}
    for module in MODULES:
        room = module.split(".")[2] if module.startswith("jointtune.autotune.") else None
        if room in reached:
            reached[room] |= {t for _, t, _, _ in _imports(module) if t.startswith("jointtune.autotune.")}
    assert {t for t in reached["runtime"] if ".workers" in t} == {"jointtune.autotune.workers.online"}
    assert not {t for t in reached["tuner"] if ".runtime" in t or ".workers" in t}


BENCH = ROOT.parent / "bench"


def _bench_private_uses(path: Path) -> Iterator[str]:
    """`line: what` for each private jointtune name a bench script reaches: a private module or name imported, or a
    private attribute of an imported jointtune module or object (`ag._plan_key`)."""
    tree = ast.parse(path.read_text())
    bound: set[str] = set()  # local names of imported jointtune modules and objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("jointtune"):
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if _private_owner(alias.name):
                        yield f"{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jointtune"):
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private_owner(node.module) or _private_owner(f"{node.module}.{alias.name}"):
                    yield f"{node.lineno}: from {node.module} import {alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                yield f"{node.lineno}: {ast.unparse(node)}"


def test_bench_uses_only_public_names() -> None:
    """The benchmarks use what the package offers its users: an internal rename must not break them."""
    scripts = sorted(BENCH.rglob("*.py"))
    assert len(scripts) > 20  # the scanner sees the benchmarks
    bad = [f"{p.relative_to(BENCH.parent)}:{use}" for p in scripts for use in _bench_private_uses(p)]
    assert not bad, "private jointtune names in bench/ (make them public API, with a docstring):\n" + "\n".join(bad)
