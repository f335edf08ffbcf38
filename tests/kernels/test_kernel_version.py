"""A family's version is derived from everything its kernels and launch import: read from a modified copy of the
package, an edit to a shared helper changes every family that imports it and no other, an edit to one family's own
kernel changes only that family, and comments and docstrings change nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import jointtune
from jointtune.errors import KernelError
from jointtune.kernels import get_family
from jointtune.kernels.runtime.version import closure_modules, closure_version, normalised_source

FAMILIES = ("ag_gemm", "gemm_rs", "flash_decode", "gemm_ar", "gemm_ar_rmsnorm")


def _module(family: str) -> str:
    """The module that defines a family (a flat module, or one inside the family's package)."""
    return type(get_family(family)).__module__


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the installed package to edit; its versions are read from there."""
    src = Path(jointtune.__file__).parent
    shutil.copytree(src, tmp_path / "jointtune", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "jointtune"


def _versions(root: Path) -> dict[str, str]:
    return {f: closure_version(_module(f), roots={"jointtune": root}) for f in FAMILIES}


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_the_family_version_is_the_closure_of_its_module_and_reads_the_copy_like_the_package(copy):
    for name in FAMILIES:
        assert get_family(name).version == closure_version(_module(name))
    assert _versions(copy) == {name: get_family(name).version for name in FAMILIES}


@pytest.mark.parametrize(
    ("module", "changed"),
    [
        ("runtime/tiles", {"ag_gemm", "gemm_rs", "gemm_ar", "gemm_ar_rmsnorm"}),  # the GEMM kernels' tile helpers
        ("runtime/launch", set(FAMILIES)),  # the shared runtime: every family
        ("runtime/signals", set(FAMILIES)),
        ("runtime/world", set(FAMILIES)),
        ("runtime/eager_graph", set(FAMILIES)),
        ("flash_decode/kernel", {"flash_decode"}),  # a family's own kernel: that family alone
        ("gemm_rs/kernel", {"gemm_rs"}),
        ("ag_gemm/plans", {"ag_gemm"}),
        ("gemm_ar/reduce", {"gemm_ar", "gemm_ar_rmsnorm"}),  # one package's kernels: its two kernels alone
        ("gemm_ar/plans", {"gemm_ar", "gemm_ar_rmsnorm"}),
    ],
)
def test_a_code_edit_changes_exactly_the_families_that_import_the_module(copy, module, changed):
    before = _versions(copy)
    _append(copy / "kernels" / f"{module}.py", "\n_EDITED_FOR_A_TEST = 1\n")
    after = _versions(copy)
    assert {f for f in FAMILIES if after[f] != before[f]} == changed


def test_comments_docstrings_and_blank_lines_keep_the_version(copy):
    before = _versions(copy)
    path = copy / "kernels" / "runtime" / "tiles.py"
    text = path.read_text(encoding="utf-8")
    body = text.replace("def grouped_tile(", "# a comment for a test\n\n\ndef grouped_tile(", 1)
    path.write_text('"""A rewritten module docstring, µs and all."""\n' + body.split('"""', 2)[2] + "  # trailing\n")
    assert _versions(copy) == before


def test_normalised_source_drops_only_comments_docstrings_and_blank_space():
    text = 'def f(x):\n    """Doc."""\n    s = "# not a comment"  # a comment\n\n    return s\n'
    assert normalised_source(text) == 'def f(x):\n    s = "# not a comment"\n    return s'


def test_a_plug_in_family_hashes_its_own_package_and_the_runtime_it_imports(copy, tmp_path):
    plug = tmp_path / "myplug"
    plug.mkdir()
    (plug / "__init__.py").write_text("")
    (plug / "helper.py").write_text("SCALE = 2\n")
    (plug / "unused.py").write_text("X = 1\n")
    (plug / "family.py").write_text(
        "from jointtune.kernels.runtime.tiles import grouped_tile\n"
        "def run():\n    from . import helper\n    return helper.SCALE\n"
    )
    roots = {"jointtune": copy, "myplug": plug}
    names = set(closure_modules("myplug.family", roots=roots))
    assert {"myplug.family", "myplug.helper", "jointtune.kernels.runtime.tiles"} <= names
    assert "myplug.unused" not in names and "jointtune.kernels.gemm_rs.kernel" not in names
    before = closure_version("myplug.family", roots=roots)
    _append(plug / "unused.py", "Y = 2\n")
    assert closure_version("myplug.family", roots=roots) == before
    _append(plug / "helper.py", "OFFSET = 1\n")
    assert closure_version("myplug.family", roots=roots) != before


def test_a_module_without_a_source_file_is_refused_by_name():
    with pytest.raises(KernelError, match="no_such_module_for_a_test"):
        closure_version("no_such_module_for_a_test")
