"""The tuner: what a study tries next, how a config is timed, and what a study holds.

Owns the Optuna side of tuning (`studies`: storage, trial states, where a study stands), the search that
turns suggestions into configs worth running (`search`), one job's study as rank 0 sees it (`handles`:
open by key, warm start, publish its best), a lock per study across processes (`locks`), timing one
config under a timing policy (`timing`), where each job stands (`results`), replaying recorded
latencies to compare strategies on a CPU (`replay`), and the values every room passes around: what to tune and
how (`settings`: `Job`, `TuneSettings`) and a tuning key with its study name (`keys`). Nothing here knows about
processes: the rank processes that drive a study are in `workers/`.

May import: `search_spaces`, `kernels`, `db`, `errors`, `timings`, Optuna. Never `runtime/` or `workers/` (they
import this).

This `__init__` imports nothing, so importing one module here doesn't pull in the others.
"""
