"""Hardware fingerprints: which machines a tuned config may be reused on, and the limits configs must fit.

Every part of jointtune keys its records by `detect().hardware_id` and checks configs against
`current_limits()`: the run-time path, the tuner, the CLI (`jointtune hw`) and the package root, which asks
`gpu_device_present()` before choosing Triton's interpreter. This package owns the fingerprint value and
its id (`_fingerprint`), reading a node's GPU topology (`_topology`) and detecting this machine
(`_detection`); this `__init__` only re-exports.

It may import `jointtune.errors` and `jointtune.search_spaces` (for `DeviceLimits`), nothing else of
jointtune, and nothing heavy at import time: torch, Triton and NVML are imported inside the functions
that need them, so names and ids work without torch.

Example:
    >>> from jointtune.hardware import detect, normalize_gpu_name
    >>> normalize_gpu_name("NVIDIA H100 80GB HBM3")
    'h100-sxm'
    >>> detect().hardware_id                                    # doctest: +SKIP
    'h200-sxm-sm90-x2-nvlink-a434a073'
"""

from __future__ import annotations

from jointtune.hardware._detection import (
    available_collectives,
    cpu_fingerprint,
    current_limits,
    detect,
    gpu_device_present,
)
from jointtune.hardware._fingerprint import (
    CPU_NAME,
    INTERCONNECTS,
    KEY_FIELDS,
    HardwareError,
    HardwareFingerprint,
    arch_name,
    arch_of,
    memory_bucket_gib,
    normalize_gpu_name,
)
from jointtune.hardware._topology import parse_topo_matrix

__all__ = [
    "CPU_NAME",
    "INTERCONNECTS",
    "KEY_FIELDS",
    "HardwareError",
    "HardwareFingerprint",
    "arch_name",
    "arch_of",
    "available_collectives",
    "cpu_fingerprint",
    "current_limits",
    "detect",
    "gpu_device_present",
    "memory_bucket_gib",
    "normalize_gpu_name",
    "parse_topo_matrix",
]
