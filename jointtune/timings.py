"""Timing policies: how a latency was measured, named once for the tuner, the run-time path and the sweeps.

A leaf of the package (no imports): the run-time path (`@joint_autotune`, the Triton drop-in) checks and
times by these names without importing the tuner, and the tuner's `timing` measures by the same counts.

- gpu: GPU time of each run behind a device-side hold (the host's launch pace is not timed);
- eager: wall time per call of `EAGER_CALLS` calls issued back to back, host included;
- graph: replays of a CUDA graph holding `GRAPH_CALLS` calls.

Example:
    >>> TIMINGS
    ('gpu', 'eager', 'graph')
"""

#: every timing policy a record, a study or a call can have
TIMINGS = ("gpu", "eager", "graph")

#: calls per timed block of the eager policy, and per captured graph of the graph policy
EAGER_CALLS = 8
GRAPH_CALLS = 4

__all__ = ["EAGER_CALLS", "GRAPH_CALLS", "TIMINGS"]
