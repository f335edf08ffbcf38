"""`jointtune spaces ...`: in-process through typer's runner, and the installed script as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jointtune.cli import spaces as spaces_cli
from jointtune.search_spaces import (
    ANCHORS,
    DeviceLimits,
    Space,
    categorical,
    get_space,
    register_space,
    unregister_space,
)

HOPPER = DeviceLimits.nominal_hopper()
SCRIPT = Path(sys.executable).parent / "jointtune"


@pytest.fixture(scope="module")
def invoke():
    app = typer.Typer()
    spaces_cli.register(app)
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(app, ["spaces", *args])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.output

    return run


@pytest.fixture
def kernelless():
    """A space no family runs (every built-in space has a kernel now): "jt_*", as other tests' spaces are named."""
    space = Space(
        "jt_cli_kernelless",
        dims=("N",),
        params=[categorical("mode", ("a", "b"), doc="a toy mode")],
        revision=1,
        default=lambda ctx: {"mode": "a"},
    )
    register_space(space)
    try:
        yield space
    finally:
        unregister_space(space.name)


def test_list_and_show(invoke, kernelless) -> None:
    rows = json.loads(invoke("list", "--json"))
    builtin = [r["name"] for r in rows if not r["name"].startswith("jt_")]  # jt_*: other tests' spaces
    assert builtin == ["ag_gemm", "flash_decode", "gemm_ar", "gemm_rs"]
    assert rows[0] == {
        "name": "ag_gemm",
        "version": get_space("ag_gemm").version,
        "revision": 7,
        "dims": ["M", "N", "K"],
        "params": 17,
        "kernels": ["ag_gemm"],
    }
    assert rows[3] == {
        "name": "gemm_rs",
        "version": get_space("gemm_rs").version,
        "revision": 8,
        "dims": ["M", "N", "K"],
        "params": 17,
        "kernels": ["gemm_rs"],
    }
    assert rows[1] == {
        "name": "flash_decode",
        "version": get_space("flash_decode").version,
        "revision": 4,
        "dims": ["B", "H", "H_KV", "S", "D"],
        "params": 9,
        "kernels": ["flash_decode"],
    }
    assert rows[2] == {
        "name": "gemm_ar",
        "version": get_space("gemm_ar").version,
        "revision": 5,
        "dims": ["M", "N", "K"],
        "params": 13,
        "kernels": ["gemm_ar", "gemm_ar_rmsnorm"],
    }
    # which spaces have a kernel comes from the family registry: every built-in space has its own now (gemm_ar's two:
    # the sum alone, and with the residual + RMSNorm epilogue)
    assert {r["name"]: r["kernels"] for r in rows if r["name"] in builtin} == {
        "ag_gemm": ["ag_gemm"],
        "flash_decode": ["flash_decode"],
        "gemm_ar": ["gemm_ar", "gemm_ar_rmsnorm"],
        "gemm_rs": ["gemm_rs"],
    }
    assert {r["name"]: r["kernels"] for r in rows}[kernelless.name] == []
    table = invoke("list")
    names = [*builtin, kernelless.name]
    lines = {name: [line for line in table.splitlines() if f" {name} " in line] for name in names}
    assert all(len(found) == 1 for found in lines.values()), table  # one row per space
    assert get_space("gemm_rs").version in lines["gemm_rs"][0] and "none yet" not in lines["gemm_rs"][0]
    assert get_space("flash_decode").version in lines["flash_decode"][0]
    # no built-in space lacks a kernel; one no family runs says so
    assert all("none yet" not in lines[name][0] for name in builtin)
    assert "none yet" in lines[kernelless.name][0]
    assert json.loads(invoke("show", "flash_decode", "--json")) == get_space("flash_decode").to_json()
    shown = invoke("show", "ag_gemm")
    assert "comm_sms" in shown and "shared_memory" in shown and 'mode == "push"' in shown
    assert "jointtune tune --kernel ag_gemm ...`)" in shown and "kernel: ag_gemm (tune it with `" in shown
    shown = invoke("show", "gemm_rs")
    assert "jointtune tune --kernel gemm_rs ...`)" in shown and "none yet" not in shown
    assert "reduce_sms" in shown and "tile_order" in shown and "atomic_tile" not in shown and "comm_sms" not in shown
    shown = invoke("show", "flash_decode")
    assert "jointtune tune --kernel flash_decode ...`)" in shown
    assert "none yet" not in shown and "combine_chunks" not in shown
    assert "items_per_flag" in shown and "push_programs" in shown and 'mode == "wait"' in shown
    assert "items_per_flag_fit" in shown and "heads_divide_group" in shown
    assert "kernel: none yet; the space can be counted and validated, not tuned or run" in invoke(
        "show", kernelless.name
    )


def test_a_new_family_gives_its_space_a_kernel(invoke, kernelless) -> None:
    from jointtune.kernels import get_family, register_family, unregister_family

    class KernellessStandIn(type(get_family("ag_gemm"))):
        name = "jt_cli_kernelless_standin"
        space = kernelless.name

    class FlashDecodeStandIn(type(get_family("ag_gemm"))):
        name = "flash_decode_standin"
        space = "flash_decode"

    register_family(KernellessStandIn())
    register_family(FlashDecodeStandIn())
    try:
        rows = {r["name"]: r["kernels"] for r in json.loads(invoke("list", "--json"))}
        # a space without a kernel gets one; a second family for a space is listed beside the first
        assert rows[kernelless.name] == ["jt_cli_kernelless_standin"]
        assert rows["flash_decode"] == ["flash_decode", "flash_decode_standin"]
        table = invoke("list")
        assert all("none yet" not in line for line in table.splitlines() if f" {kernelless.name} " in line)
        shown = invoke("show", kernelless.name)
        assert "kernel: jt_cli_kernelless_standin (tune it with" in shown and "none yet" not in shown
        shown = invoke("show", "flash_decode")
        assert "kernel: flash_decode, flash_decode_standin (tune it with" in shown  # the first is what to tune
    finally:
        unregister_family("jt_cli_kernelless_standin")
        unregister_family("flash_decode_standin")
    rows = {r["name"]: r["kernels"] for r in json.loads(invoke("list", "--json"))}
    assert rows[kernelless.name] == [] and rows["flash_decode"] == ["flash_decode"]


def test_count_one_problem_matches_the_api(invoke) -> None:
    space = get_space("gemm_rs")
    problem = space.make_problem("1024x8192x8192", dtype="fp16", world_size=4)
    for shape in ("1024x8192x8192", "K=8192,M=1024,N=8192"):
        data = json.loads(
            invoke("count", "gemm_rs", "--shape", shape, "--dtype", "fp16", "--world-size", "4", "--nominal", "--json")
        )
        (row,) = data["counts"]
        assert row["total"] == space.count(problem, HOPPER) and row["modes"] == space.count_by_mode(problem, HOPPER)
        assert row["shape"] == {"M": 1024, "N": 8192, "K": 8192} and row["world_size"] == 4
    assert str(space.count(problem, HOPPER)) in invoke(
        "count", "gemm_rs", "--shape", "1024x8192x8192", "--dtype", "fp16", "--world-size", "4", "--nominal"
    )


def test_count_anchors_covers_every_anchor(invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(invoke("count", "--anchors", "--nominal", "--json"))
    assert data["limits"].startswith("nominal Hopper")
    assert [(r["space"], r["shape"]) for r in data["counts"]] == [(n, s) for n in ANCHORS for s in ANCHORS[n]]
    for row in data["counts"]:
        space = get_space(row["space"])
        problem = space.make_problem(row["shape"], dtype="bf16", world_size=2)
        assert row["total"] == space.count(problem, HOPPER) == sum(row["modes"].values())
    only = json.loads(invoke("count", "flash_decode", "--anchors", "--nominal", "--json"))["counts"]
    assert {r["space"] for r in only} == {"flash_decode"}
    # off a terminal rich has 80 columns: the table must still show the longest shape whole
    monkeypatch.setenv("COLUMNS", "80")
    table = invoke("count", "--anchors", "--nominal")
    assert "8192x4096x12288" in table and "16x64x8x131072x128" in table and "baseline" in table


def test_anchor_counts_take_given_limits() -> None:
    small = DeviceLimits(max_shared_mem=49152, num_sms=20, compute_capability=(7, 5))
    assert spaces_cli.resolve_limits(small) == (small, "given limits")
    assert spaces_cli.resolve_limits(nominal=True)[0] == HOPPER
    tight = spaces_cli.anchor_counts(small, ["ag_gemm"])
    roomy = spaces_cli.anchor_counts(HOPPER, ["ag_gemm"])
    assert all(t["total"] < r["total"] for t, r in zip(tight, roomy, strict=True))


def test_validate_prints_the_canonical_config_and_hash(invoke) -> None:
    config = {"num_stages": 3, "mode": "pull", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
    config |= {"GROUP_M": 8, "num_warps": 8.0, "SPLIT_K": 2}
    out = json.loads(
        invoke("validate", "ag_gemm", "--shape", "8192x4096x12288", "--config", json.dumps(config), "--nominal")
    )
    space = get_space("ag_gemm")
    assert out["config"] == {**config, "num_warps": 8}
    assert list(out["config"]) == [
        "mode",
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_K",
        "GROUP_M",
        "num_warps",
        "num_stages",
        "SPLIT_K",
    ]
    assert out["hash"] == space.config_hash(out["config"]) and out["version"] == space.version


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["count", "nope", "--shape", "1x2x3"], "error: space: 'nope' is not a known search space; known: ag_gemm"),
        (["count", "ag_gemm", "--shape", "8192x4096"], "error: shape: '8192x4096' has 2 dims"),
        (["count", "ag_gemm"], "error: --shape: missing for space 'ag_gemm'"),
        (["count"], "error: space: missing; give one of ag_gemm"),
        (["count", "--anchors", "--shape", "1x1x1"], "error: --shape: not allowed with --anchors"),
        (["count", "ag_gemm", "--shape", "8x8x8", "--dtype", "int8"], "error: dtype: 'int8' is not supported"),
        *(
            (
                ["count", name, "--shape", shape, "--dtype", "fp32"],
                f"error: dtype: 'float32' is not supported by {name}; allowed: bfloat16, float16",
            )
            for name, shape in (("ag_gemm", "8x8x8"), ("gemm_rs", "8x8x8"), ("flash_decode", "1x8x8x64x64"))
        ),
        (["count", "ag_gemm", "--shape", "²x8x8"], "error: shape.M: '²' in '²x8x8' is not allowed"),
        (["count", "ag_gemm", "--shape", "18014398509481984x8x8"], "error: shape.M: '18014398509481984'"),
        (["show", "nope"], "error: space: 'nope' is not a known search space"),
        (["validate", "ag_gemm", "--shape", "8x8x8", "--config", "[" * 3000 + "]" * 3000], "error: --config: '[[["),
        (["validate", "ag_gemm", "--shape", "8x8x8", "--config", '{"mode": ' + "9" * 5000 + "}"], "error: --config: "),
        (["validate", "ag_gemm", "--shape", "8x8x8", "--config", "{bad"], "error: --config: '{bad' is not valid JSON"),
        (["validate", "ag_gemm", "--shape", "8x8x8"], "error: --config: missing"),
        (
            ["validate", "ag_gemm", "--shape", "8x8x8", "--config", '{"mode": "pul"}'],
            "error: ag_gemm config: mode: 'pul' is not allowed",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    from jointtune.cli import main

    with pytest.raises(SystemExit) as e:
        main(["spaces", *args, *(["--nominal"] if args[0] != "show" else [])])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_installed_script_counts_anchors_and_refuses_bad_input() -> None:
    ok = subprocess.run([str(SCRIPT), "spaces", "count", "--anchors"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("ag_gemm") == 5 and ok.stdout.count("flash_decode") == len(ANCHORS["flash_decode"])
    bad = subprocess.run(
        [str(SCRIPT), "spaces", "count", "ag_gemm", "--shape", "8192x4096x12288", "--world-size", "3", "--nominal"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "error: world_size: 3 is not allowed for ag_gemm; M=8192 must be divisible by it\n"
