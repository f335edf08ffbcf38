"""Detecting this machine's fingerprint and device limits (cached per process).

Without a GPU, or with TRITON_INTERPRET=1, the fingerprint is the CPU interpreter's, and the limits are
a nominal Hopper's. torch is imported only where a GPU can be seen (`gpu_device_present`): `jointtune hw`
on a CPU machine answers without it.

Example:
    >>> fp = cpu_fingerprint()
    >>> fp.name, fp.interconnect, fp.hardware_id.startswith("cpu-interpreter-x1-none-")
    ('cpu-interpreter', 'none', True)
"""

from __future__ import annotations

import functools
import os
import platform

from jointtune.hardware._fingerprint import (
    CPU_NAME,
    HardwareError,
    HardwareFingerprint,
    _is_count,
    memory_bucket_gib,
    normalize_gpu_name,
)
from jointtune.hardware._topology import _interconnect, _nvidia_smi
from jointtune.search_spaces import DeviceLimits


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
        collectives=available_collectives(),
    )


@functools.cache
def available_collectives() -> tuple[str, ...]:
    """The baseline's collective variants this build of torch and NCCL can run (`DeviceLimits.collectives` on CUDA;
    `search_spaces._collectives` names them and what each needs)."""
    import torch

    out = ["nccl"]
    try:
        import torch.distributed as dist

        nccl = tuple(torch.cuda.nccl.version())
        group_type = dist.ProcessGroupNCCL
    except (AttributeError, ImportError, RuntimeError):
        return tuple(out)
    register = getattr(group_type, "register_mem_pool", None)
    if register is not None and hasattr(torch.cuda, "MemPool") and "symm" in (register.__doc__ or ""):
        if nccl >= (2, 27):
            out.append("nccl_symm")
        # NCCL 2.28.9 under torch 2.11 failed the copy-engine all-gather on 4x H200 (cudaErrorInvalidValue at the first
        # call on a zero-CTA communicator with window buffers: bench/results/fused_ops_*_4xH200_2026-11-26.json), so
        # it is offered only where asked for, to try a newer build
        try:
            ce = (
                os.environ.get("JOINTTUNE_NCCL_CE", "").strip() == "1"
                and nccl >= (2, 28)
                and hasattr(group_type.Options().config, "cta_policy")
            )
        except Exception:  # an Options type of another shape: no copy-engine policy to ask for
            ce = False
        if ce:
            out.append("nccl_ce")
    ops = getattr(torch.ops, "symm_mem", None)
    if ops is not None and hasattr(ops, "two_shot_all_reduce_"):
        out.append("torch_two_shot")
    if ops is not None and hasattr(ops, "one_shot_all_reduce"):
        out.append("torch_one_shot")
    return tuple(out)
