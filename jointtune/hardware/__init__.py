"""Hardware fingerprints: which machines a tuned config may be reused on.

A config measured on one machine is only trusted on machines alike in what decides kernel speed.
The *key fields* (`KEY_FIELDS`) say what "alike" means; they alone make `hardware_id`:

    name                normalised GPU name: "h200-sxm", "h100-pcie", "rtx-4090", "cpu-interpreter"
    compute_capability  (major, minor) as torch reports it
    num_sms             streaming multiprocessors
    memory_gib          device memory rounded up to a coarse bucket (`memory_bucket_gib`), so what
                        the driver reserves or a driver update changes does not move it
    gpus_per_node       GPUs one node gives the job
    interconnect        "nvlink", "pcie-p2p" or "none" between those GPUs (worst pair decides)
    nvlink_links        NVLink links per GPU pair, fewest over the pairs; 0 without NVLink

Only *recorded* (shown to people, never keyed, so a driver or library update keeps every stored
result): the name as reported, driver, CUDA/HIP runtime, torch and Triton versions, CPU model, and
where the topology was read from. `hardware_id` is a readable slug plus the first 8 hex digits of a
SHA-256 over the key fields in canonical JSON: "h200-sxm-sm90-x2-nvlink-3f9a1c2b". It depends on
nothing but those values, so it is the same on every run and every jointtune version.

GPU name rules (`normalize_gpu_name`), so the many spellings of one product meet:
1. lower-case; words split on spaces, '-', '_', '/', ',' and parentheses;
2. vendor and brand words (nvidia, amd, tesla, geforce, instinct, generation, vf), memory sizes
   ("80gb") and memory kinds ("hbm3", "hbm2e", "gddr6x") are dropped: memory is its own field;
3. the form factor becomes one word: sxm, sxm2..sxm5 -> "sxm"; pcie -> "pcie"; nvl -> "nvl". SXM
   boards differ from PCIe and NVL boards in power and links, so the forms never share a name;
4. products sold in several forms (V100, A100, A800, H100, H800, H200, B100, B200) always carry
   one; a name without it is the SXM board, as the driver names those ("NVIDIA H100 80GB HBM3",
   "NVIDIA H200");
5. the remaining words, joined by '-'.

Topology is read from `nvidia-smi topo -m` (parsed by the pure `parse_topo_matrix`), else from
NVML through `pynvml` (package nvidia-ml-py, optional), else only from torch's peer-access check.
Without a GPU, or with TRITON_INTERPRET=1, the fingerprint is the CPU interpreter's.

Example:
    >>> fp = cpu_fingerprint()
    >>> fp.name, fp.interconnect, fp.hardware_id.startswith("cpu-interpreter-x1-none-")
    ('cpu-interpreter', 'none', True)

Longer than 300 lines because detection, the topology parser and the value object belong
together: each reads or writes exactly the fields the others define.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from jointtune.errors import JointtuneError
from jointtune.search_spaces import DeviceLimits

#: fields that make `hardware_id`; all others are only recorded.
KEY_FIELDS: tuple[str, ...] = (
    "name",
    "compute_capability",
    "num_sms",
    "memory_gib",
    "gpus_per_node",
    "interconnect",
    "nvlink_links",
)
INTERCONNECTS: tuple[str, ...] = ("nvlink", "pcie-p2p", "none")
CPU_NAME = "cpu-interpreter"

_DROP_WORDS = frozenset({"nvidia", "amd", "tesla", "geforce", "instinct", "generation", "vf"})
_MEMORY_WORD = re.compile(r"^(\d+(gb|g|gib)|hbm\d*e?|gddr\d*x?)$")
_FORM_WORDS = {"sxm": re.compile(r"^sxm\d*$"), "pcie": re.compile(r"^pcie\d*$"), "nvl": re.compile(r"^nvl$")}
_MULTI_FORM = frozenset({"v100", "a100", "a800", "h100", "h800", "h200", "b100", "b200"})
_SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class HardwareError(JointtuneError, ValueError):
    """A GPU name, topology text or fingerprint field that can't be understood."""


def normalize_gpu_name(name: str) -> str:
    """The product slug of a GPU name as the driver, torch or a person writes it (rules above)."""
    words = [w for w in re.split(r"[\s\-_/,()]+", str(name).lower()) if w]
    forms = {form for w in words for form, pattern in _FORM_WORDS.items() if pattern.match(w)}
    product = [
        w
        for w in words
        if w not in _DROP_WORDS and not _MEMORY_WORD.match(w) and not any(p.match(w) for p in _FORM_WORDS.values())
    ]
    if not product:
        raise HardwareError(f"gpu name: {name!r} names no product; expected e.g. 'NVIDIA H200'")
    if len(forms) > 1:
        raise HardwareError(f"gpu name: {name!r} names forms {sorted(forms)}; a board has one of sxm, pcie, nvl")
    if not forms and product[0] in _MULTI_FORM:
        forms = {"sxm"}
    return "-".join(product + sorted(forms))


def memory_bucket_gib(total_bytes: int) -> int:
    """Device memory as a coarse, stable GiB value: 143771 MiB -> 144, 81559 MiB -> 80.

    Rounded up (reported memory is below the label) to steps of 2 GiB under 16, 4 under 64, 8 above,
    after taking off half a GiB so a value just over a step stays in it.
    """
    gib = total_bytes / 2**30
    if gib <= 0:
        return 0
    step = 2 if gib < 16 else 4 if gib < 64 else 8
    return int(step * max(1, math.ceil((gib - 0.5) / step)))


@dataclass(frozen=True)
class HardwareFingerprint:
    """What decides which tuned configs are reusable here (`KEY_FIELDS`), plus what is only recorded.

    Example:
        >>> fp = HardwareFingerprint(name="h200-sxm", compute_capability=(9, 0), num_sms=132,
        ...     memory_gib=144, gpus_per_node=2, interconnect="nvlink", nvlink_links=18)
        >>> fp.hardware_id.startswith("h200-sxm-sm90-x2-nvlink-")
        True
    """

    name: str
    compute_capability: tuple[int, int]
    num_sms: int
    memory_gib: int
    gpus_per_node: int
    interconnect: str
    nvlink_links: int = 0
    # recorded only
    raw_name: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    cpu_model: str | None = None
    topology_source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SLUG.match(self.name):
            raise HardwareError(f"name: {self.name!r} is not allowed; use normalize_gpu_name() (e.g. 'h200-sxm')")
        cc = self.compute_capability
        if not isinstance(cc, Sequence) or len(cc) != 2 or not all(_is_count(v) for v in cc):
            raise HardwareError(f"compute_capability: {cc!r} is not allowed; expected two integers >= 0")
        object.__setattr__(self, "compute_capability", (int(cc[0]), int(cc[1])))
        for field in ("num_sms", "memory_gib", "nvlink_links"):
            if not _is_count(getattr(self, field)):
                raise HardwareError(f"{field}: {getattr(self, field)!r} is not allowed; expected an integer >= 0")
        if not _is_count(self.gpus_per_node) or self.gpus_per_node < 1:
            raise HardwareError(f"gpus_per_node: {self.gpus_per_node!r} is not allowed; expected an integer >= 1")
        if self.interconnect not in INTERCONNECTS:
            raise HardwareError(f"interconnect: {self.interconnect!r} is not allowed; allowed: {INTERCONNECTS}")
        if (self.nvlink_links > 0) != (self.interconnect == "nvlink"):
            raise HardwareError(
                f"nvlink_links: {self.nvlink_links} does not fit interconnect {self.interconnect!r}; "
                "it is > 0 exactly when the interconnect is 'nvlink'"
            )
        if self.gpus_per_node == 1 and self.interconnect != "none":
            raise HardwareError(f"interconnect: {self.interconnect!r} is not allowed with 1 GPU; use 'none'")

    @property
    def is_interpreter(self) -> bool:
        return self.name == CPU_NAME

    def key_dict(self) -> dict[str, Any]:
        """The key fields as plain JSON values: what `hardware_id` hashes."""
        data = {f: getattr(self, f) for f in KEY_FIELDS}
        data["compute_capability"] = list(self.compute_capability)
        return data

    @property
    def hardware_id(self) -> str:
        canonical = json.dumps(self.key_dict(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
        major, minor = self.compute_capability
        parts = [self.name]
        if not self.is_interpreter:
            parts.append(f"sm{major}{minor}")
        parts += [f"x{self.gpus_per_node}", self.interconnect, digest]
        return "-".join(parts)

    def to_json(self) -> dict[str, Any]:
        """Every field plus `hardware_id` (for people and fixtures; `from_json` recomputes it)."""
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        data["hardware_id"] = self.hardware_id
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HardwareFingerprint:
        """Rebuild from `to_json()` output; unknown keys (such as `hardware_id`) are ignored."""
        missing = [f for f in KEY_FIELDS if f not in data]
        if missing:
            raise HardwareError(f"fingerprint: fields {missing} are missing; required: {list(KEY_FIELDS)}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---------------------------------------------------------------------------------------- topology
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


# ---------------------------------------------------------------------------------------- detection
def _interpreting() -> bool:
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on", "y"):
        return True
    if not gpu_device_present():
        return True
    import torch

    return not torch.cuda.is_available()


#: device files a visible NVIDIA (or AMD, or WSL) GPU always brings into a machine or container
_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/gpus", "/dev/kfd", "/dev/dxg")


def gpu_device_present() -> bool:
    """False when no process here can see a GPU: no GPU device files, or CUDA_VISIBLE_DEVICES hides
    them all. Torch would say the same, but importing it takes seconds (`jointtune hw` on a CPU
    machine needs none of it); True means "ask torch"."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(os.path.exists(path) for path in _GPU_DEVICE_FILES)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _package_version(*names: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _driver_version() -> str | None:
    out = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return out.split()[0] if out and out.split() else None


def cpu_fingerprint(*, gpus_per_node: int = 1) -> HardwareFingerprint:
    """The fingerprint of Triton's CPU interpreter: the same key on every CPU machine."""
    return HardwareFingerprint(
        name=CPU_NAME,
        compute_capability=(0, 0),
        num_sms=0,
        memory_gib=0,
        gpus_per_node=gpus_per_node,
        interconnect="none",
        raw_name="cpu",
        torch=_package_version("torch"),
        triton=_package_version("triton", "pytorch-triton-rocm"),
        cpu_model=_cpu_model(),
        topology_source="none",
    )


@functools.cache
def _detect(gpus_per_node: int | None, interpreting: bool) -> HardwareFingerprint:
    if interpreting:
        return cpu_fingerprint(gpus_per_node=gpus_per_node or 1)
    import torch

    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    visible = torch.cuda.device_count()
    count = gpus_per_node or visible
    interconnect, links, source = _interconnect(count, visible)
    return HardwareFingerprint(
        name=normalize_gpu_name(props.name),
        compute_capability=(int(props.major), int(props.minor)),
        num_sms=int(props.multi_processor_count),
        memory_gib=memory_bucket_gib(int(props.total_memory)),
        gpus_per_node=count,
        interconnect=interconnect,
        nvlink_links=links,
        raw_name=props.name,
        driver=_driver_version(),
        cuda=torch.version.cuda or getattr(torch.version, "hip", None),
        torch=str(torch.__version__),
        triton=_package_version("triton", "pytorch-triton-rocm"),
        cpu_model=_cpu_model(),
        topology_source=source,
    )


def detect(*, gpus_per_node: int | None = None) -> HardwareFingerprint:
    """This machine's fingerprint (cached per process), the CPU interpreter's when no GPU runs kernels.

    `gpus_per_node` overrides the GPU count torch sees, for jobs that show each rank only its own GPU.
    """
    if gpus_per_node is not None and (not _is_count(gpus_per_node) or gpus_per_node < 1):
        raise HardwareError(f"gpus_per_node: {gpus_per_node!r} is not allowed; expected an integer >= 1")
    return _detect(gpus_per_node, _interpreting())


def current_limits() -> DeviceLimits:
    """The limits spaces check configs against, for the current device (nominal Hopper on the CPU)."""
    if _interpreting():
        return DeviceLimits.nominal_hopper(interpreter=True)
    import torch

    return _gpu_limits(torch.cuda.current_device())


@functools.cache
def _gpu_limits(device: int) -> DeviceLimits:
    import torch

    props = torch.cuda.get_device_properties(device)
    try:
        from triton.runtime import driver

        shared = int(driver.active.utils.get_device_properties(device)["max_shared_mem"])
    except Exception:  # Triton's driver layer varies by version; torch knows it too
        shared = int(getattr(props, "shared_memory_per_block_optin", 0))
    if shared <= 0:
        raise HardwareError(f"max_shared_mem: device {device} ({props.name}) reports {shared}; expected > 0")
    return DeviceLimits(
        max_shared_mem=shared,
        num_sms=int(props.multi_processor_count),
        compute_capability=(int(props.major), int(props.minor)),
    )
