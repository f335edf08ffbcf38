"""Hardware fingerprints: name rules, topology parsing, stable ids, detection here, `jointtune hw`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jointtune import hardware
from jointtune.errors import JointtuneError
from jointtune.hardware import (
    KEY_FIELDS,
    HardwareError,
    HardwareFingerprint,
    _topology,
    arch_of,
    cpu_fingerprint,
    current_limits,
    detect,
    memory_bucket_gib,
    normalize_gpu_name,
    parse_topo_matrix,
)
from jointtune.search_spaces._problem import DeviceLimits

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.json"))

H200X2 = HardwareFingerprint(
    name="h200-sxm",
    compute_capability=(9, 0),
    num_sms=132,
    memory_gib=144,
    gpus_per_node=2,
    interconnect="nvlink",
    nvlink_links=18,
    raw_name="NVIDIA H200",
    driver="580.159.04",
    cuda="13.0",
    torch="2.11.0+cu130",
    triton="3.6.0",
)


# ------------------------------------------------------------------------------------------ names
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("H100 PCIe", "h100-pcie"),
        ("H100 SXM5 80GB", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("  nvidia   h200  ", "h200-sxm"),
        ("NVIDIA H800", "h800-sxm"),
        ("NVIDIA H800 PCIe", "h800-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm"),
        ("A100-PCIE-40GB", "a100-pcie"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie"),
        ("NVIDIA A800-SXM4-80GB", "a800-sxm"),
        ("Tesla V100-SXM2-16GB", "v100-sxm"),
        ("Tesla V100-PCIE-32GB", "v100-pcie"),
        ("NVIDIA B200", "b200-sxm"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla T4", "t4"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X VF", "mi300x"),
    ],
)
def test_normalize_gpu_name(raw: str, expected: str) -> None:
    assert normalize_gpu_name(raw) == expected


def test_forms_of_one_product_never_share_a_name() -> None:
    h200 = {normalize_gpu_name(n) for n in ("NVIDIA H200", "NVIDIA H200 NVL")}
    h100 = {normalize_gpu_name(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL")}
    assert len(h200) == 2 and len(h100) == 3


@pytest.mark.parametrize("raw", ["", "NVIDIA", "NVIDIA 80GB HBM3", "H100 PCIe SXM5"])
def test_normalize_gpu_name_rejects_names_without_one_product_and_form(raw: str) -> None:
    with pytest.raises(HardwareError, match="gpu name"):
        normalize_gpu_name(raw)


@pytest.mark.parametrize(
    ("mib", "gib"),
    [
        *[(143771, 144), (81559, 80), (81920, 80), (40960, 40), (24564, 24), (46068, 48), (49140, 48)],
        *[(196592, 192), (95830, 96), (15360, 16), (8192, 8), (0, 0)],
    ],
)
def test_memory_bucket_absorbs_driver_reserved_memory(mib: int, gib: int) -> None:
    assert memory_bucket_gib(mib * 2**20) == gib
    if gib:  # a few hundred MiB more or less reserved by another driver keeps the bucket
        assert memory_bucket_gib((mib - 300) * 2**20) == gib


# --------------------------------------------------------------------------------------- topology
# `nvidia-smi topo -m` as captured on a 2xH200 machine (driver 580.159.04): tab-separated, the
# header underlined with ANSI codes, the legend after the matrix.
TOPO_H200X2 = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)

TOPO_H100X8 = "\n".join(
    ["        GPU0  GPU1  GPU2  GPU3  GPU4  GPU5  GPU6  GPU7  NIC0  CPU Affinity  NUMA Affinity  GPU NUMA ID"]
    + [
        f"GPU{i}  " + "  ".join(" X " if j == i else "NV18" for j in range(8)) + f"  {'PXB' if i == 0 else 'SYS'}"
        f"  {'0-55' if i < 4 else '56-111'}  {i // 4}  N/A"
        for i in range(8)
    ]
    + ["NIC0  PXB  " + "  ".join(["SYS"] * 7) + "   X "]
)

# Two H100 NVL pairs joined by NVLink bridges, the pairs on different sockets.
TOPO_H100_NVL_PAIRS = """
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV12    SYS     SYS     0-31            0               N/A
GPU1    NV12     X      SYS     SYS     0-31            0               N/A
GPU2    SYS     SYS      X      NV12    32-63           1               N/A
GPU3    SYS     SYS     NV12     X      32-63           1               N/A
"""

# A PCIe box: two GPUs under one switch, two more behind the host bridge; an old driver's layout
# (mlx5_0 column, no NUMA columns).
TOPO_PCIE = """
        GPU0    GPU1    GPU2    GPU3    mlx5_0  CPU Affinity
GPU0     X      PIX     PXB     NODE    PHB     0-23
GPU1    PIX      X      PXB     NODE    PHB     0-23
GPU2    PXB     PXB      X      NODE    PHB     0-23
GPU3    NODE    NODE    NODE     X      PHB     0-23
mlx5_0  PHB     PHB     PHB     PHB      X
"""

TOPO_OLD_SOC = """
        GPU0    GPU1    CPU Affinity
GPU0     X      SOC     0-11
GPU1    SOC      X      12-23
"""


def test_parse_topo_h200_pair_over_nvlink() -> None:
    topo = parse_topo_matrix(TOPO_H200X2)
    assert topo == {"gpus": [0, 1], "pairs": {"0-1": "NV18"}, "interconnect": "nvlink", "nvlink_links": 18}


def test_parse_topo_eight_gpus_and_a_subset() -> None:
    full = parse_topo_matrix(TOPO_H100X8)
    assert full["gpus"] == list(range(8)) and len(full["pairs"]) == 28
    assert (full["interconnect"], full["nvlink_links"]) == ("nvlink", 18)
    part = parse_topo_matrix(TOPO_H100X8, gpus=[2, 5])
    assert part["pairs"] == {"2-5": "NV18"}


def test_parse_topo_nvl_pairs_worst_pair_decides() -> None:
    whole = parse_topo_matrix(TOPO_H100_NVL_PAIRS)
    assert (whole["interconnect"], whole["nvlink_links"]) == ("none", 0)
    assert whole["pairs"]["0-1"] == "NV12" and whole["pairs"]["1-2"] == "SYS"
    bridged = parse_topo_matrix(TOPO_H100_NVL_PAIRS, gpus=[2, 3])
    assert (bridged["interconnect"], bridged["nvlink_links"]) == ("nvlink", 12)


def test_parse_topo_pcie_paths_below_the_cpu_link_allow_p2p() -> None:
    topo = parse_topo_matrix(TOPO_PCIE)
    assert topo["pairs"] == {
        "0-1": "PIX",
        "0-2": "PXB",
        "0-3": "NODE",
        "1-2": "PXB",
        "1-3": "NODE",
        "2-3": "NODE",
    }
    assert (topo["interconnect"], topo["nvlink_links"]) == ("pcie-p2p", 0)
    assert parse_topo_matrix(TOPO_OLD_SOC)["interconnect"] == "none"


def test_parse_topo_mixed_nvlink_and_pcie_is_pcie() -> None:
    text = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\n"
        "GPU0\t X \tNV4\tPIX\t0-7\nGPU1\tNV4\t X \tPIX\t0-7\nGPU2\tPIX\tPIX\t X \t0-7\n"
    )
    assert parse_topo_matrix(text)["interconnect"] == "pcie-p2p"
    assert parse_topo_matrix(text, gpus=[0, 1])["nvlink_links"] == 4


def test_parse_topo_asymmetric_cells_take_the_worse() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV8\nGPU1\tNV6\t X \n"
    assert parse_topo_matrix(text)["nvlink_links"] == 6


def test_parse_topo_single_gpu_has_no_interconnect() -> None:
    assert parse_topo_matrix("\tGPU0\tCPU Affinity\nGPU0\t X \t0-63\n")["interconnect"] == "none"


@pytest.mark.parametrize(
    ("text", "gpus", "match"),
    [
        ("No devices were found\n", None, "no header"),
        ("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n", None, "'FOO' is unknown"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n", None, "row GPU0 has 1 cells"),
        (TOPO_H200X2, [0, 3], r"gpus: \[3\] are not in the topology"),
    ],
)
def test_parse_topo_errors_name_the_problem(text: str, gpus: list[int] | None, match: str) -> None:
    with pytest.raises(HardwareError, match=match):
        parse_topo_matrix(text, gpus=gpus)


# ------------------------------------------------------------------------------------ fingerprint
def test_hardware_id_is_a_stable_golden_value() -> None:
    # Stored records carry this id: a change here orphans every result tuned on 2xH200.
    assert H200X2.hardware_id == "h200-sxm-sm90-x2-nvlink-a434a073"
    assert tuple(H200X2.key_dict()) == KEY_FIELDS


def test_only_key_fields_change_the_id() -> None:
    recorded = dataclasses.replace(H200X2, driver="999.1", cuda="14.0", torch="3.0", triton="4.0", raw_name="x")
    assert recorded.hardware_id == H200X2.hardware_id
    changes = {
        "name": "h200-nvl",
        "compute_capability": (9, 1),
        "num_sms": 114,
        "memory_gib": 80,
        "gpus_per_node": 4,
        "nvlink_links": 12,
    }
    ids = {dataclasses.replace(H200X2, **{k: v}).hardware_id for k, v in changes.items()}
    pcie = dataclasses.replace(H200X2, interconnect="pcie-p2p", nvlink_links=0).hardware_id
    assert len(ids | {pcie, H200X2.hardware_id}) == len(changes) + 2
    assert pcie.startswith("h200-sxm-sm90-x2-pcie-p2p-")


def test_json_round_trip() -> None:
    data = json.loads(json.dumps(H200X2.to_json()))
    assert data["hardware_id"] == H200X2.hardware_id and data["compute_capability"] == [9, 0]
    assert HardwareFingerprint.from_json(data) == H200X2
    assert HardwareFingerprint.from_json({**data, "added_later": 1}) == H200X2
    minimal = {k: v for k, v in data.items() if k in KEY_FIELDS}
    assert HardwareFingerprint.from_json(minimal).hardware_id == H200X2.hardware_id


def test_the_architecture_is_shared_by_gpus_of_one_generation_and_keys_nothing() -> None:
    h100 = dataclasses.replace(H200X2, name="h100-sxm", memory_gib=80)
    a100 = dataclasses.replace(H200X2, name="a100-sxm", compute_capability=(8, 0), num_sms=108, memory_gib=80)
    assert H200X2.arch == h100.arch == "sm_90" and a100.arch == "sm_80" and cpu_fingerprint().arch == "cpu"
    assert h100.hardware_id != H200X2.hardware_id  # an id still names one GPU: arch only groups them
    assert HardwareFingerprint.from_json(H200X2.to_json()) == H200X2 and H200X2.to_json()["arch"] == "sm_90"
    # a stored profile: its fingerprint says it; an older one by its compute capability; a placeholder by its id
    assert arch_of(h100.hardware_id, {**h100.to_json(), "arch": None}) == "sm_90"
    assert arch_of("b200-sxm-sm100-x8-nvlink-0a1b2c3d", {}) == "sm_100"
    assert arch_of(cpu_fingerprint(gpus_per_node=2).hardware_id) == "cpu"
    assert arch_of("my-cluster-gpus") is None


def test_from_json_names_missing_fields() -> None:
    with pytest.raises(HardwareError, match=r"\['num_sms', 'gpus_per_node', 'interconnect', 'nvlink_links'\] are"):
        HardwareFingerprint.from_json({"name": "h200-sxm", "compute_capability": [9, 0], "memory_gib": 144})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"name": "NVIDIA H200"}, "name: 'NVIDIA H200' is not allowed"),
        ({"compute_capability": (9,)}, r"compute_capability: \(9,\) is not allowed"),
        ({"num_sms": -1}, "num_sms: -1 is not allowed"),
        ({"memory_gib": 1.5}, "memory_gib: 1.5 is not allowed"),
        ({"gpus_per_node": 0}, "gpus_per_node: 0 is not allowed"),
        ({"interconnect": "infiniband"}, "interconnect: 'infiniband' is not allowed"),
        ({"nvlink_links": 0}, "nvlink_links: 0 does not fit interconnect 'nvlink'"),
        ({"gpus_per_node": 1}, "interconnect: 'nvlink' is not allowed with 1 GPU"),
    ],
)
def test_invalid_fields_are_named(change: dict, match: str) -> None:
    with pytest.raises(HardwareError, match=match) as info:
        dataclasses.replace(H200X2, **change)
    assert isinstance(info.value, JointtuneError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_recorded_fixture_round_trips_to_its_id(path: Path) -> None:
    """Each fixture is `jointtune hw --json` from a real machine; its id must never drift."""
    data = json.loads(path.read_text())
    fingerprint = HardwareFingerprint.from_json(data)
    assert fingerprint.hardware_id == data["hardware_id"]
    # `arch` is derived (from the compute capability) and was added after most fixtures were recorded
    assert fingerprint.to_json() == {**data, "arch": fingerprint.arch}
    assert arch_of(data["hardware_id"], data) == arch_of(data["hardware_id"]) == fingerprint.arch
    if not fingerprint.is_interpreter and fingerprint.raw_name:
        assert normalize_gpu_name(fingerprint.raw_name) == fingerprint.name


# -------------------------------------------------------------------------------- this machine
def test_detect_is_cached_and_consistent() -> None:
    fingerprint = detect()
    assert detect() is fingerprint
    assert HardwareFingerprint.from_json(fingerprint.to_json()) == fingerprint
    if fingerprint.is_interpreter:
        assert fingerprint.key_dict() == hardware.cpu_fingerprint().key_dict()
        assert fingerprint.hardware_id.startswith("cpu-interpreter-x1-none-")
        assert current_limits() == DeviceLimits.nominal_hopper(interpreter=True)
    else:
        limits = current_limits()
        assert limits.num_sms == fingerprint.num_sms > 0 and not limits.interpreter
        assert limits.compute_capability == fingerprint.compute_capability
        assert limits.max_shared_mem >= 48 * 1024


def test_detect_gpus_per_node_override() -> None:
    assert detect(gpus_per_node=2).gpus_per_node == 2
    with pytest.raises(HardwareError, match="gpus_per_node: 0 is not allowed"):
        detect(gpus_per_node=0)


def test_interpreter_env_means_cpu_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert detect().name == "cpu-interpreter"
    assert current_limits() == DeviceLimits.nominal_hopper(interpreter=True)


def test_package_import_is_lazy() -> None:
    code = (
        "import sys, jointtune.autotune as a\n"
        "assert 'jointtune.hardware' not in sys.modules\n"
        "assert a.normalize_gpu_name('NVIDIA H200') == 'h200-sxm'\n"
        "assert 'torch' not in sys.modules, 'names and ids must not need torch'\n"
        "assert 'detect' in dir(a)\n"
        "try:\n    a.no_such_name\nexcept AttributeError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "has no attribute 'no_such_name'" in out.stdout


@pytest.mark.parametrize(
    ("env", "visible", "wanted", "expected"),
    [
        (None, 2, 2, [0, 1]),
        ("4,5", 2, 2, [4, 5]),
        ("6", 1, 2, [0, 1]),  # each rank sees its own GPU: the node's first GPUs stand for the job's
        ("GPU-0108b095,GPU-55d37422", 2, 2, [0, 1]),
        ("0,1,2,3", 4, 2, [0, 1]),
    ],
)
def test_topology_reads_the_gpus_the_job_uses(
    monkeypatch: pytest.MonkeyPatch, env: str | None, visible: int, wanted: int, expected: list[int]
) -> None:
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert _topology._physical_gpus(visible, wanted) == expected


# ------------------------------------------------------------------------------------------- CLI
def _cli() -> typer.Typer:
    from jointtune.cli import hw

    app = typer.Typer()
    app.callback()(lambda: None)  # a group, as in `jointtune`, so `hw` is a subcommand
    hw.register(app)
    return app


def test_cli_hw_json_matches_detect() -> None:
    result = CliRunner().invoke(_cli(), ["hw", "--json"], env={**os.environ, "COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == detect().to_json()


def test_cli_hw_table_shows_the_id_and_roles() -> None:
    result = CliRunner().invoke(_cli(), ["hw"], env={**os.environ, "COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert f"hardware id: {detect().hardware_id}" in result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") == 4}
    assert set(rows) == {f.name for f in dataclasses.fields(HardwareFingerprint)} | {"arch"}
    assert all(("key" in rows[f]) == (f in KEY_FIELDS) for f in rows) and "derived" in rows["arch"]


@pytest.mark.skipif(hardware.gpu_device_present(), reason="this machine shows GPU device files")
def test_hw_on_a_cpu_machine_does_not_import_torch() -> None:
    """`jointtune hw` answered in ~0.4 s instead of ~2 s: torch's import was most of it."""
    code = "import sys; from jointtune.cli import main; main(['hw', '--json']); print('torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *fingerprint, imported = done.stdout.strip().splitlines()
    assert json.loads("\n".join(fingerprint))["name"] == "cpu-interpreter"
    assert imported == "False"
