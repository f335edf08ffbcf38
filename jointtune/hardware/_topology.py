r"""The GPU topology of a node: which interconnect its GPUs share, read from nvidia-smi, NVML or torch.

Topology is read from `nvidia-smi topo -m` (parsed by the pure `parse_topo_matrix`), else from
NVML through `pynvml` (package nvidia-ml-py, optional), else only from torch's peer-access check.
The worst pair of the job's GPUs decides the fingerprint's `interconnect` and `nvlink_links`.

Example:
    >>> parse_topo_matrix("        GPU0    GPU1\nGPU0     X      NV18\nGPU1    NV18     X\n")["interconnect"]
    'nvlink'
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from jointtune.hardware._fingerprint import HardwareError

# nvidia-smi's path codes, best first. SOC is what old drivers printed for SYS.
_PCIE_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}
_P2P_PATHS = frozenset({"PIX", "PXB", "PHB", "NODE"})  # below the CPU interconnect: PCIe P2P works
_NV_CODE = re.compile(r"^NV(\d+)$")
_GPU = re.compile(r"^GPU(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _rank(code: str) -> int:
    """How bad a path is: PCIe paths by distance, NVLink by fewer links (NV6 is worse than NV8)."""
    nv = _NV_CODE.match(code)
    return -int(nv.group(1)) if nv else _PCIE_RANK[code]


def _summarize_topology(gpus: Sequence[int], pairs: Mapping[str, str]) -> dict[str, Any]:
    """Classify GPU pairs ({"0-1": "NV18"}) into the key's interconnect; the worst pair decides."""
    if not pairs:
        return {"gpus": list(gpus), "pairs": {}, "interconnect": "none", "nvlink_links": 0}
    worst = max(pairs.values(), key=_rank)
    if _NV_CODE.match(worst):  # every pair is NVLink; the worst has the fewest links
        interconnect, links = "nvlink", -_rank(worst)
    else:
        interconnect, links = ("pcie-p2p" if worst in _P2P_PATHS else "none"), 0
    return {"gpus": list(gpus), "pairs": dict(pairs), "interconnect": interconnect, "nvlink_links": links}


def parse_topo_matrix(text: str, *, gpus: Sequence[int] | None = None) -> dict[str, Any]:
    """Parse `nvidia-smi topo -m` output into {"gpus", "pairs", "interconnect", "nvlink_links"}.

    Only GPU rows and columns are read (NICs, CPU/NUMA affinity and the legend are skipped);
    `gpus` picks the GPUs (nvidia-smi indices) the job uses, all of them by default. A pair whose two
    cells disagree takes the worse one.
    """
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "GPU0" in line.split()), None)
    if header_at is None:
        raise HardwareError("nvidia-smi topo -m: no header with GPU0 found; expected the GPU matrix")
    columns: list[str] = []
    for token in lines[header_at].split():
        if token in ("CPU", "NUMA"):
            break
        columns.append(token)
    matrix: dict[int, dict[int, str]] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or not _GPU.match(tokens[0]):
            continue
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) < len(columns):
            raise HardwareError(f"nvidia-smi topo -m: row {tokens[0]} has {len(cells)} cells; expected {len(columns)}")
        matrix[int(tokens[0][3:])] = {
            int(col[3:]): cell for col, cell in zip(columns, cells, strict=True) if _GPU.match(col)
        }
    chosen = sorted(matrix) if gpus is None else list(gpus)
    absent = [g for g in chosen if g not in matrix]
    if absent:
        raise HardwareError(f"gpus: {absent} are not in the topology; present: {sorted(matrix)}")
    pairs = {}
    for n, a in enumerate(chosen):
        for b in chosen[n + 1 :]:
            codes = [matrix[a].get(b, ""), matrix[b].get(a, "")]
            for code in codes:
                if not _NV_CODE.match(code) and code not in _PCIE_RANK:
                    raise HardwareError(
                        f"nvidia-smi topo -m: GPU{a}/GPU{b} link {code!r} is unknown; "
                        f"allowed: NV<n>, {', '.join(_PCIE_RANK)}"
                    )
            pairs[f"{a}-{b}"] = max(codes, key=_rank)
    return _summarize_topology(chosen, pairs)


def _nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's output, or None where it is missing or fails (detection then falls back)."""
    exe = shutil.which("nvidia-smi")
    try:
        return (
            subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=True).stdout if exe else None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _topology_from_nvidia_smi(gpus: Sequence[int]) -> dict[str, Any] | None:
    text = _nvidia_smi("topo", "-m")
    try:
        return None if text is None else parse_topo_matrix(text, gpus=gpus)
    except HardwareError:
        return None


def _topology_from_nvml(gpus: Sequence[int]) -> dict[str, Any] | None:
    """The same pairs as nvidia-smi prints, asked of NVML (links counted per peer, or via NVSwitch)."""
    try:
        import pynvml
    except ImportError:
        return None
    levels = {10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in gpus}
        bus = {g: _bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId) for g, h in handles.items()}
        remotes: dict[int, list[str]] = {}
        for g, h in handles.items():
            remotes[g] = []
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED:
                        remotes[g].append(_bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
                except pynvml.NVMLError:
                    break
        pairs = {}
        for n, a in enumerate(gpus):
            for b in gpus[n + 1 :]:
                status = pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if status == pynvml.NVML_P2P_STATUS_OK and remotes[a]:
                    direct = remotes[a].count(bus[b])
                    pairs[f"{a}-{b}"] = f"NV{direct or len(remotes[a])}"  # not direct: through NVSwitch
                else:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                    pairs[f"{a}-{b}"] = levels.get(int(level), "PIX")
        return _summarize_topology(gpus, pairs)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _bus_id(value: bytes | str) -> str:
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.lower().removeprefix("0000")  # NVML writes 8- or 4-digit PCI domains


def _physical_gpus(visible: int, wanted: int) -> list[int]:
    """nvidia-smi/NVML indices of the GPUs the job uses: CUDA_VISIBLE_DEVICES when it lists indices."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES", "").replace(" ", "").split(",")
    indices = [int(v) for v in listed] if all(v.isdigit() for v in listed) and listed != [""] else []
    indices = indices[:visible] or list(range(visible))
    return indices[:wanted] if wanted <= len(indices) else list(range(wanted))


def _torch_peer_access(count: int) -> bool:
    import torch

    return all(torch.cuda.can_device_access_peer(a, b) for a in range(count) for b in range(count) if a != b)


def _interconnect(gpus_per_node: int, visible: int) -> tuple[str, int, str]:
    if gpus_per_node == 1:
        return "none", 0, "single-gpu"
    gpus = _physical_gpus(visible, gpus_per_node)
    source, topo = "nvidia-smi", _topology_from_nvidia_smi(gpus)
    if topo is None:
        source, topo = "nvml", _topology_from_nvml(gpus)
    if topo is None:
        source, topo = "torch", {"interconnect": "none", "nvlink_links": 0}
    interconnect, links = topo["interconnect"], topo["nvlink_links"]
    if interconnect != "nvlink" and visible >= 2:  # torch knows best whether PCIe P2P is enabled
        interconnect = "pcie-p2p" if _torch_peer_access(min(visible, gpus_per_node)) else "none"
    return interconnect, links, source
