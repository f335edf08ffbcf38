"""Autotuning: the run-time decorator, the tuner, and the processes that run it, in three rooms.

    runtime/   the run-time path: `@joint_autotune` (the thin factory users import, also from `jointtune`), the
               lookup chain, rank agreement, timing policies, the service client, the Triton drop-in, and
               tuning a key online (through the workers' one entry point, `workers.online`)
    tuner/     the study side: search, Optuna studies, timing a config, results, replay, and the values every
               room passes around: what to tune (`Job`) and how (`TuneSettings`), tuning keys and study names
    workers/   the process side: coordinator, executor, rank processes, supervisor, watchdog, runner, online
               tuning's entry point, and sweeps (`workers/sweeps/`: sweep files, the registry, progress, ETA,
               reports)

Each room's docstring says what it owns and what it may import. The tuner imports neither of the others;
workers/ builds on it; runtime/ imports the tuner's shared values and reaches workers/ only to tune a key online,
through `workers.online`, and only the lazy exports (here and in `jointtune`) import runtime/. Hardware
fingerprints, which every part uses, live beside this package in `jointtune.hardware`.

Names are re-exported lazily: `from jointtune.autotune import detect` imports only the module that
defines `detect`, so light users (the service, the CLI's `hw`) never pay for torch, Triton or
Optuna they don't use. To export a name, add one line to `_EXPORTS` (name -> submodule), one to
`__all__`, and one to the `TYPE_CHECKING` import block for type checkers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jointtune._lazy import lazy_exports

if TYPE_CHECKING:
    from jointtune.autotune.runtime.client import ConfigClient, ServiceWarning
    from jointtune.autotune.runtime.decorator import joint_autotune
    from jointtune.autotune.runtime.launcher import JointAutotuned
    from jointtune.autotune.runtime.lookup import LookupWarning
    from jointtune.autotune.runtime.rules import NoConfigError
    from jointtune.autotune.runtime.triton_compat import JointAutotuner
    from jointtune.autotune.tuner.replay import ReplayTable, compare, replay
    from jointtune.autotune.tuner.results import collect
    from jointtune.autotune.tuner.settings import Job, TuneSettings
    from jointtune.autotune.workers.runner import run_jobs
    from jointtune.autotune.workers.sweeps.registry import load_sweep, register_sweep
    from jointtune.autotune.workers.sweeps.sweepfile import load_sweep_file
    from jointtune.hardware import (
        KEY_FIELDS,
        HardwareError,
        HardwareFingerprint,
        cpu_fingerprint,
        current_limits,
        detect,
        memory_bucket_gib,
        normalize_gpu_name,
        parse_topo_matrix,
    )

#: public name -> the module that defines it: a submodule of this package, or a full module name
#: (the fingerprint names, still exported here since they moved to `jointtune.hardware`).
_EXPORTS: dict[str, str] = {
    "KEY_FIELDS": "jointtune.hardware",
    "HardwareError": "jointtune.hardware",
    "HardwareFingerprint": "jointtune.hardware",
    "cpu_fingerprint": "jointtune.hardware",
    "current_limits": "jointtune.hardware",
    "detect": "jointtune.hardware",
    "memory_bucket_gib": "jointtune.hardware",
    "normalize_gpu_name": "jointtune.hardware",
    "parse_topo_matrix": "jointtune.hardware",
    "ConfigClient": "runtime.client",
    "joint_autotune": "runtime.decorator",
    "JointAutotuned": "runtime.launcher",
    "NoConfigError": "runtime.rules",
    "JointAutotuner": "runtime.triton_compat",
    "LookupWarning": "runtime.lookup",
    "ServiceWarning": "runtime.client",
    "Job": "tuner.settings",
    "TuneSettings": "tuner.settings",
    "run_jobs": "workers.runner",
    "collect": "tuner.results",
    "load_sweep_file": "workers.sweeps.sweepfile",
    "register_sweep": "workers.sweeps.registry",
    "load_sweep": "workers.sweeps.registry",
    "ReplayTable": "tuner.replay",
    "replay": "tuner.replay",
    "compare": "tuner.replay",
}

__all__ = [
    "KEY_FIELDS",
    "ConfigClient",
    "HardwareError",
    "HardwareFingerprint",
    "Job",
    "JointAutotuned",
    "JointAutotuner",
    "LookupWarning",
    "NoConfigError",
    "ReplayTable",
    "ServiceWarning",
    "TuneSettings",
    "collect",
    "compare",
    "cpu_fingerprint",
    "current_limits",
    "detect",
    "joint_autotune",
    "load_sweep",
    "load_sweep_file",
    "memory_bucket_gib",
    "normalize_gpu_name",
    "parse_topo_matrix",
    "register_sweep",
    "replay",
    "run_jobs",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
