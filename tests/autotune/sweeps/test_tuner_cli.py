"""`jointtune tune / sweep / worker` end to end, and sweep files validated field by field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jointtune.autotune.tuner.settings import TuneSettings
from jointtune.autotune.workers.sweeps.sweepfile import SweepFileError, load_sweep_file, parse_sweep
from jointtune.cli import main
from jointtune.db import RecordKey, open_store

JOINTTUNE = [sys.executable, "-c", "from jointtune.cli import main; main()"]
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sweep.yaml"
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from tuner import cold_phases  # noqa: E402


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*JOINTTUNE, *args], env=env, capture_output=True, text=True, timeout=180)


def test_tune_measures_a_real_family_and_writes_plots_and_a_record(families, tmp_path, subprocess_env):
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    report = tmp_path / "report"
    args = ["tune", "--kernel", "jt_matmul", "--shape", "64x48x32", "--dtype", "fp32", "--world-size", "2"]
    args += ["--trials", "6", "--warmup", "0", "--iters", "3", "--db", url, "--report", str(report)]
    args += ["--import", "jt_families"]
    phases = tmp_path / "phases.jsonl"
    done = _run(args, {**subprocess_env, "JOINTTUNE_PHASES": str(phases)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tuned configs" in done.stdout and "jt_matmul" in done.stdout
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert pngs == ["jt_matmul_K32_M64_N48_float32_w2.png"]
    assert (report / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (result,) = json.loads((report / "results.json").read_text())
    assert result["trials"] == 6 and result["status"] == "trials" and result["best_us"] > 0
    assert result["best_host_us"] > 0  # the host's launch time of one call, recorded beside the GPU time
    records = open_store(url).list_records(RecordKey.any(kernel="jt_matmul"))
    assert len(records) == 1 and records[0].config == result["best_config"]
    # where its time went: the CLI's and the rank's phases, the rank a process started with the CLI (it imported
    # meanwhile, then waited), the pieces of the critical path adding up to the run's wall time
    lines = cold_phases.load(phases)
    summary = cold_phases.summarise(lines)
    rank0 = [line for line in lines if line["who"] == "rank0"]
    assert {line["phase"] for line in rank0} >= {"preload", "wait", "start", "done"}
    assert [line["trial"] for line in rank0 if line["phase"] == "measure"] == [1, 2, 3, 4, 5, 6]
    assert sum(row["s"] for row in summary["critical_path"]) == pytest.approx(summary["wall_s"], abs=0.1)
    assert 0 < summary["record_stored_s"] <= summary["wall_s"]


def test_a_shape_that_fails_entirely_exits_nonzero(families, tmp_path, subprocess_env):
    sweep = tmp_path / "broken.yaml"
    sweep.write_text(
        "imports: [jt_families]\n"
        "profiles:\n  cpu:\n    tuning: {warmup: 0, iters: 1}\n"
        "    jobs: [{kernel: jt_broken, shapes: ['64'], dtypes: [fp32], world_size: 2, trials: 3}]\n"
    )
    done = _run(["sweep", str(sweep), "--db", f"sqlite:///{tmp_path / 'jt.db'}", "--profile", "cpu"], subprocess_env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: error 3" in done.stdout
    assert "no config could be measured for: jt_broken M=64 float32 w2" in done.stdout


def _bad(capsys, tmp_path, text: str) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(path), "--db", f"sqlite:///{tmp_path / 'jt.db'}", "--register-only"])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_sweep_files_are_validated_with_messages_that_name_the_field(families, capsys, tmp_path):
    head = "profiles:\n  cpu:\n    jobs:\n"
    err = _bad(capsys, tmp_path, head + "      - {kernel: jt_sleep, shapes: ['64'], trials: 0}\n")
    assert "profiles.cpu.jobs[0].trials: Input should be greater than or equal to 1 (got 0)" in err
    err = _bad(capsys, tmp_path, head + "      - {kernel: nope, shapes: ['64']}\n")
    assert "profiles.cpu.jobs[0]: kernel: 'nope' is not a known kernel family" in err
    err = _bad(capsys, tmp_path, head + "      - {kernel: jt_sleep, shapes: ['64x3'], dtypes: [fp32]}\n")
    assert "profiles.cpu.jobs[0].shapes[0] (64x3, fp32, world_size 2): shape" in err
    err = _bad(capsys, tmp_path, head + "      - {kernel: jt_sleep, shapes: ['64'], final_rounds: -1}\n")
    assert "profiles.cpu.jobs[0].final_rounds: Input should be greater than or equal to 0 (got -1)" in err
    err = _bad(capsys, tmp_path, head + "      - {kernel: jt_sleep, shapes: ['64'], stratgy: tpe}\n")
    assert "profiles.cpu.jobs[0].stratgy: Extra inputs are not permitted" in err
    err = _bad(capsys, tmp_path, "name: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested deeper than a sweep file can be" in err
    err = _bad(capsys, tmp_path, "profiles:\n  tpu:\n    jobs: []\n")
    assert "profiles.tpu" in err
    err = _bad(capsys, tmp_path, head + "      - {kernel: jt_sleep, shapes: ['64'], dtypes: [int8]}\n")
    assert "dtype: 'int8' is not supported" in err
    err = _bad(
        capsys, tmp_path, "imports: [no_such_module_xyz]\n" + head + "      - {kernel: ag_gemm, shapes: ['64x64x64']}\n"
    )
    assert "imports[0]: 'no_such_module_xyz' can't be imported" in err
    job = "      - {kernel: ag_gemm, shapes: ['64x64x64']}\n"
    for field, value in (("world_size", "[]"), ("trials", "'64'"), ("trials", "64.0"), ("trials", "true")):
        err = _bad(capsys, tmp_path, head + job.replace("}", f", {field}: {value}}}"))
        assert f"profiles.cpu.jobs[0].{field}: Input should be a valid integer" in err
    err = _bad(capsys, tmp_path, head + "      - {kernel: ag_gemm, shapes: [{M: true, N: 64, K: 64}]}\n")
    assert "profiles.cpu.jobs[0].shapes[0].M: Input should be a valid integer (got True)" in err
    for name in ("x" * 600, "a\\0b", "two words"):
        err = _bad(capsys, tmp_path, f'name: "{name}"\n' + head + job)
        assert "name: " in err and "is not allowed; use 1 to 128 of A-Z a-z 0-9 _ . : -" in err
    bad_stem = tmp_path / "my sweep.yaml"
    bad_stem.write_text(head + job)
    with pytest.raises(SystemExit):
        main(["sweep", str(bad_stem), "--db", f"sqlite:///{tmp_path / 'jt.db'}", "--register-only"])
    assert "name: 'my sweep' (the file's stem, the default: set name:) is not allowed" in capsys.readouterr().err
    for name, why in (("''", "ValueError"), ("'.relative'", "TypeError")):
        err = _bad(
            capsys, tmp_path, f"imports: [{name}]\n" + head + "      - {kernel: ag_gemm, shapes: ['64x64x64']}\n"
        )
        assert f"imports[0]: {name} can't be imported ({why}" in err


def test_flash_decode_jobs_are_tuned_at_the_bucket_their_calls_look_up(families):
    jobs = parse_sweep(
        {
            "profiles": {
                "cpu": {
                    "jobs": [
                        {
                            "kernel": "flash_decode",
                            "shapes": ["1x4x1x100x64", "1x4x1x128x64", "1x4x1x200x64"],
                            "world_size": 2,
                        }
                    ]
                }
            }
        }
    )
    assert [dict(j.shape)["S"] for j in jobs.profiles["cpu"]] == [128, 256]  # 100 and 128 share a bucket


def test_layered_tuning_settings_and_the_example_file(families):
    sweep = parse_sweep(
        {
            "name": "layers",
            "tuning": {"seed": 5, "trials": 20, "watchdog": {"compile_s": 30}},
            "profiles": {
                "cpu": {
                    "tuning": {"trials": 10, "iters": 2},
                    "jobs": [
                        {
                            "kernel": "jt_sleep",
                            "shapes": ["64", {"M": 32}],
                            "dtypes": ["fp32"],
                            "world_size": [1, 2],
                            "patience": 4,
                        }
                    ],
                }
            },
        }
    )
    jobs = sweep.jobs("cpu")
    assert len(jobs) == 4 and {j.world_size for j in jobs} == {1, 2}
    assert jobs[0].settings == TuneSettings(seed=5, trials=10, iters=2, patience=4, watchdog_compile_s=30)
    with pytest.raises(SweepFileError, match="profile: 'gpu' is not in sweep 'layers'"):
        sweep.jobs("gpu")
    example = load_sweep_file(EXAMPLE)
    assert example.name == "readme-ag-gemm"
    cpu, gpu = example.jobs("cpu"), example.jobs("gpu")
    assert all(j.kernel in ("ag_gemm", "gemm_rs", "flash_decode") and j.world_size == 2 for j in (*cpu, *gpu))
    assert {j.kernel for j in cpu} == {j.kernel for j in gpu} == {"ag_gemm", "gemm_rs", "flash_decode"}
    (fd,) = [j for j in cpu if j.kernel == "flash_decode"]  # a small decode shape the interpreter runs in seconds
    assert fd.problem.dims == {"B": 1, "H": 4, "H_KV": 1, "S": 256, "D": 64}
    assert {j.settings.timing for j in gpu if j.kernel == "flash_decode"} == {"graph"}  # how decode steps run
    assert min(j.problem.dims["M"] for j in gpu if j.kernel == "ag_gemm") >= 128
    rs = [j for j in cpu if j.kernel == "gemm_rs"]
    assert len(rs) == 2 and max(j.problem.dims["M"] for j in rs) <= 128
    cpu = [j for j in cpu if j.kernel == "ag_gemm"]
    bf16 = [j for j in cpu if j.dtype == "bfloat16"]
    assert len(bf16) == 6 and max(j.problem.dims["M"] for j in bf16) <= 128
    # the CPU's fused-mode showcase: every config of a small sub-space of large tiles, fp16
    (fp16,) = [j for j in cpu if j.dtype == "float16"]
    assert fp16.problem.dims == {"M": 512, "N": 512, "K": 512} and fp16.settings.strategy == "exhaustive"
    assert dict(fp16.settings.restrict)["mode"] == ("ce", "pull")


def test_tune_at_world_size_4_simulates_four_ranks(families, tmp_path, subprocess_env):
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    args = ["tune", "--kernel", "jt_matmul", "--shape", "64x48x32", "--dtype", "fp32", "--world-size", "4"]
    args += ["--trials", "4", "--warmup", "0", "--iters", "2", "--db", url, "--import", "jt_families"]
    done = _run(args, subprocess_env)
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = open_store(url).list_records(RecordKey.any(kernel="jt_matmul"))
    assert record.world_size == 4 and record.shape == {"M": 64, "N": 48, "K": 32}
