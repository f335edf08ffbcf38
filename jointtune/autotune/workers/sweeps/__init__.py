"""Sweeps: which kernels and shapes to tune, registered for every node, and what a person watching sees.

Owns the sweep file format (`sweepfile`), sweeps registered in the shared Optuna storage so worker groups
on any node find them (`registry`), live progress and the tuned table (`progress`), time left (`eta`),
and tuning curves as PNG and JSON (`report`).

May import: `tuner/` (results, the study space, the exhaustive check, the shared `settings`), `kernels`, `errors`,
`timings`. Never `runtime/`, nor the rest of `workers/` (which imports this: the coordinator serves a registered
sweep and shows its progress).

This `__init__` imports nothing, so the CLI can read a sweep file without loading the tuner's processes.
"""
