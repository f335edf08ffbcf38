"""A kernel family's version: a hash of everything its kernels and launch import, found by reading the source.

Every stored record carries its family's version in its key, so a record is served only to the kernel it was
measured on. The version is derived, never listed by hand: starting from the module that defines the family, we
follow every `import` and `from ... import` statement (at any depth, those inside functions too) to the modules
in scope, and hash what we reach. In scope are `jointtune.kernels` (the shared runtime in `jointtune.kernels.runtime`
every built-in family stands on, and the built-in family packages) and the family module's own package (a built-in
family's package, `jointtune.kernels.ag_gemm`; a plug-in family's helpers count too). Importing a module runs its
parent packages' `__init__`, so those count as well (the runtime's imports nothing: a family hashes only the runtime
modules it uses). Triton compiles only what a kernel reaches through such imports, so this closure covers what is
launched as well as what launches it. A change to a shared module (`tiles`, `signals`, the world, the launch, plan
and op runtime) therefore gives every family that imports it a new version and retires their records; a change to
one family's own kernel retires only its own. The built-in families' table (`jointtune.families`) is outside the
scope: adding a family changes no other family's version.

What is hashed is each module's source with comments, docstrings, blank lines and trailing spaces removed (found
with `tokenize` and `ast` positions, which read the same on every Python this package supports), then its dotted
name, in name order. Editing a comment or a docstring keeps the version; any change to code changes it.

The space's version (`Space.version`) is separate: it hashes the space's declaration (params, choices, rules),
which decides what a tuner searches and what a lookup accepts. A record keys on the kernel version and carries the
space version; `jointtune retune` lists and re-tunes the keys left behind by either.

Example:
    >>> from jointtune.kernels.runtime.version import closure_modules
    >>> "jointtune.kernels.runtime.tiles" in closure_modules("jointtune.kernels.gemm_rs")
    True
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path

from jointtune.errors import KernelError

#: the package every built-in family's runtime lives in
RUNTIME_PACKAGE = "jointtune.kernels"


def _in_scope(name: str, scopes: Iterable[str]) -> bool:
    return any(name == scope or name.startswith(scope + ".") for scope in scopes)


def _locate(name: str, roots: dict[str, Path]) -> Path | None:
    """The file of module `name`: under a root given for its top package, else where Python would find it."""
    top = name.split(".")[0]
    if top in roots:
        base = roots[top].joinpath(*name.split(".")[1:])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package that fails to import, or a name that is not a module
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _loaded_file(name: str) -> Path | None:
    """The source file of an imported module Python can't find by name (`__main__` of a script)."""
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file) if file and file.endswith(".py") else None


def _imported_names(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Every module name an import statement of module `name` may load: `from a.b import c` names both `a.b` and
    `a.b.c` (c may be a submodule), and each parent package (importing a.b runs a/__init__.py)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    parents = {".".join(n.split(".")[:i]) for n in found for i in range(1, n.count(".") + 1)}
    return {n for n in found | parents if n}


def closure_modules(module: str, *, roots: dict[str, Path] | None = None) -> dict[str, Path]:
    """Module name -> file of `module` and every module in scope that it imports, directly or through others.

    `roots` maps a top-level package name to the folder to read it from instead of the installed one (tests read a
    modified copy of the package this way)."""
    roots = roots or {}
    parent = module.rpartition(".")[0]
    scopes = [RUNTIME_PACKAGE, *([parent] if parent else [])]
    out: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        path = _locate(name, roots) or (_loaded_file(name) if name == module else None)
        if path is None:
            if name == module:
                raise KernelError(
                    f"kernel version: module {module!r} has no source file to hash; define the family in a .py file"
                )
            continue  # a name imported from a module rather than a submodule
        out[name] = path
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for found in _imported_names(tree, name, path.name == "__init__.py"):
            if found not in out and _in_scope(found, scopes):
                todo.append(found)
    return dict(sorted(out.items()))


def _chars(line: str, byte_offset: int) -> int:
    """ast's column (UTF-8 bytes) as a column in characters, as tokenize and str slicing count."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))


def normalised_source(text: str) -> str:
    """`text` without comments, docstrings, blank lines and trailing spaces: what the version hashes."""
    lines = text.splitlines()
    spans: list[tuple[int, int, int, int]] = []  # (start line, start col, end line, end col), 1-based lines
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            spans.append((*tok.start, *tok.end))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
                and first.end_col_offset is not None
            ):
                start = _chars(lines[first.lineno - 1], first.col_offset)
                end = _chars(lines[first.end_lineno - 1], first.end_col_offset)
                spans.append((first.lineno, start, first.end_lineno, end))
    # Blank the spans from the last one up, so the earlier ones' positions still hold.
    for start_line, start_col, end_line, end_col in sorted(spans, reverse=True):
        first, last = lines[start_line - 1], lines[end_line - 1]
        lines[start_line - 1 : end_line] = [first[:start_col] + " " + last[end_col:]]
    return "\n".join(stripped for line in lines if (stripped := line.rstrip()))


def closure_version(module: str, *, roots: dict[str, Path] | None = None) -> str:
    """12 hex digits of the hash of `closure_modules(module)`'s normalised sources, in name order."""
    digest = hashlib.sha256()
    for name, path in closure_modules(module, roots=roots).items():
        digest.update(f"{name}\n{normalised_source(path.read_text(encoding='utf-8'))}\n".encode())
    return digest.hexdigest()[:12]
