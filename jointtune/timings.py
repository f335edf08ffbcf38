"""Timing policies: how a latency was measured, named once for the tuner, the run-time path and the sweeps.

A leaf of the package (no imports): the run-time path (`@joint_autotune`, the Triton drop-in) checks and
times by these names without importing the tuner, and the tuner's `timing` measures by the same counts.

- gpu: GPU time of each run behind a device-side hold (the host's launch pace is not timed);
- eager: wall time per call of `EAGER_CALLS` calls issued back to back, host included;
- graph: replays of a CUDA graph holding `GRAPH_CALLS` calls;
- interp: wall time of a call in Triton's CPU interpreter (simulated ranks, one program at a time in Python).
  There every policy but graph measures just that, so whatever a run there asked for, its studies and records
  say interp (`measured_as`): the interpreter's wall time is neither GPU time nor a GPU's eager time.

Example:
    >>> TIMINGS
    ('gpu', 'eager', 'graph', 'interp')
    >>> measured_as("gpu", "cpu-interpreter-x1-none-1a2b3c4d"), measured_as("eager", "h200-sxm-sm90-x2-nvlink-a434a073")
    ('interp', 'eager')
"""

#: every timing policy a record, a study or a call can have
TIMINGS = ("gpu", "eager", "graph", "interp")

#: the policy of every measurement in Triton's CPU interpreter
INTERP = "interp"

#: how the hardware ids of Triton's CPU interpreter begin (`jointtune.hardware.CPU_NAME` and a dash)
INTERPRETER_ID_PREFIX = "cpu-interpreter-"

#: calls per timed block of the eager policy, and per captured graph of the graph policy
EAGER_CALLS = 8
GRAPH_CALLS = 4


def measured_as(policy: str, hardware_id: str) -> str:
    """What a measurement under `policy` on `hardware_id` really is: `interp` on the CPU interpreter, else `policy`."""
    return INTERP if hardware_id.startswith(INTERPRETER_ID_PREFIX) else policy


__all__ = ["EAGER_CALLS", "GRAPH_CALLS", "INTERP", "INTERPRETER_ID_PREFIX", "TIMINGS", "measured_as"]
