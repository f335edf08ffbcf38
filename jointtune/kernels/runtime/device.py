"""Facts about where kernels run, decided in one place: interpreted or compiled, the device's size,
whether launches of different ranks can run at the same time, and whether a CUDA graph is being captured.

Triton reads TRITON_INTERPRET when a kernel is defined, so `interpreted()` is read once, the first time
anything asks, and every module of this package asks here (no module reads the variable itself).
This module imports torch but not Triton: the CLI and the tuner ask it before any kernel exists.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

import torch

from jointtune.errors import KernelError

if TYPE_CHECKING:
    from jointtune.search_spaces import DeviceLimits

_TRUE = ("1", "true", "yes", "on", "y")


def choose_interpreter() -> None:
    """TRITON_INTERPRET=1 where no GPU can run kernels, so a script runs on a GPU node and on a laptop alike.

    It must be set before Triton is imported: Triton reads it as it defines kernels, its own library's
    included. So it is left alone where the user chose already, and where Triton is imported already (then
    Triton runs compiled, and a kernel launched without a GPU says what to do: `check_launchable`)."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    from jointtune.hardware import gpu_device_present

    if gpu_device_present() and torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"


def check_launchable(kernel_name: str, device: torch.device) -> None:
    """KernelError unless a Triton kernel can run on `device`: compiled on a GPU, or in the interpreter."""
    if device.type != "cuda" and not interpreted():
        raise KernelError(
            f"{kernel_name}: Triton kernels can't run on {device.type}: there is no GPU, and Triton was imported "
            "before jointtune could choose its CPU interpreter (torch.compile imports it too); set "
            "TRITON_INTERPRET=1 in the environment, or import jointtune's kernels before anything imports Triton"
        )


@functools.cache
def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1, chosen before import)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; the interpreter's nominal Hopper (132) on the CPU."""
    if device.type == "cuda":
        return _cuda_props(device.index if device.index is not None else torch.cuda.current_device())[0]
    return 132


def device_limits(device: torch.device) -> DeviceLimits:
    """What a space's constraints check configs against on `device` (nominal Hopper on the CPU)."""
    from jointtune.search_spaces import DeviceLimits

    if device.type != "cuda":
        return DeviceLimits.nominal_hopper(interpreter=True)
    from jointtune.hardware import available_collectives

    sms, shared, cc = _cuda_props(device.index if device.index is not None else torch.cuda.current_device())
    return DeviceLimits(max_shared_mem=shared, num_sms=sms, compute_capability=cc, collectives=available_collectives())


@functools.cache
def _cuda_props(index: int) -> tuple[int, int, tuple[int, int]]:
    props = torch.cuda.get_device_properties(index)
    shared = int(getattr(props, "shared_memory_per_block_optin", 0))
    if shared <= 0:
        try:  # older torch builds lack the field; Triton's driver knows it
            from triton.runtime import driver

            shared = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
        except Exception as exc:
            raise KernelError(f"max_shared_mem: device {index} ({props.name}) does not report it") from exc
    return int(props.multi_processor_count), shared, (int(props.major), int(props.minor))


def capturing(device: torch.device) -> bool:
    """True while the current stream of `device` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def refuse_during_capture(device: torch.device, what: str) -> None:
    """Raise (before anything is queued) if `what` (allocation, collective, compile) would run during capture."""
    if capturing(device):
        raise KernelError(
            f"{what} during CUDA graph capture: a first call of this op, shape, dtype and config allocates "
            "symmetric memory and compiles kernels, which a graph can't hold; call it once before capturing "
            "(warm-up), then capture"
        )
