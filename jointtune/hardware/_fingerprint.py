"""The hardware fingerprint value: its key fields, its id, and the GPU name rules that feed it.

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

The *architecture* (`arch`, "sm_90" for H100 and H200 alike, "cpu" for the interpreter) is derived from the
compute capability and shown beside the key fields (`to_json`, `arch_of` for a stored profile or a bare id): the
tuner takes tuned configs of the same shape on another GPU of the same architecture as warm starts (a prior, never
the answer), since those GPUs run the same kernels with the same limits.

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

Example:
    >>> fp = HardwareFingerprint(name="h200-sxm", compute_capability=(9, 0), num_sms=132,
    ...     memory_gib=144, gpus_per_node=2, interconnect="nvlink", nvlink_links=18)
    >>> fp.hardware_id.startswith("h200-sxm-sm90-x2-nvlink-")
    True
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from jointtune.errors import JointtuneError

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


_ID_ARCH = re.compile(r"-sm(\d+)(\d)-")


def arch_name(compute_capability: Sequence[int]) -> str:
    """The architecture of a compute capability as `nvcc` names it: (9, 0) -> "sm_90", (10, 0) -> "sm_100"; the
    interpreter's (0, 0) -> "cpu"."""
    major, minor = (int(v) for v in compute_capability)
    return "cpu" if (major, minor) == (0, 0) else f"sm_{major}{minor}"


def arch_of(hardware_id: str, fingerprint: Mapping[str, Any] | None = None) -> str | None:
    """The architecture of a stored hardware profile: from its fingerprint (`arch`, else its compute capability),
    else from its id as `hardware_id` writes it ("h100-sxm-sm90-x8-nvlink-..." -> "sm_90"); None when neither says.
    Profiles stored before `arch` existed, and placeholders with an empty fingerprint, are read the same way."""
    data = fingerprint or {}
    if isinstance(data.get("arch"), str) and data["arch"]:
        return str(data["arch"])
    cc = data.get("compute_capability")
    if isinstance(cc, Sequence) and not isinstance(cc, str) and len(cc) == 2 and all(_is_count(v) for v in cc):
        return "cpu" if data.get("name") == CPU_NAME else arch_name(cc)
    if hardware_id.startswith(CPU_NAME + "-"):
        return "cpu"
    match = _ID_ARCH.search(hardware_id)
    return f"sm_{match.group(1)}{match.group(2)}" if match else None


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

    @property
    def arch(self) -> str:
        """The GPU architecture ("sm_90"), "cpu" for the interpreter: not a key field (the compute capability is)."""
        return "cpu" if self.is_interpreter else arch_name(self.compute_capability)

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
        """Every field plus `arch` and `hardware_id` (for people and fixtures; `from_json` recomputes both)."""
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        data["arch"] = self.arch
        data["hardware_id"] = self.hardware_id
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HardwareFingerprint:
        """Rebuild from `to_json()` output; unknown and derived keys (`arch`, `hardware_id`) are ignored."""
        missing = [f for f in KEY_FIELDS if f not in data]
        if missing:
            raise HardwareError(f"fingerprint: fields {missing} are missing; required: {list(KEY_FIELDS)}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
