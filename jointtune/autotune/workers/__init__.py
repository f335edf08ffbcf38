"""The process side of tuning: the rank processes of a tuning group, what keeps them running, and sweeps.

Owns rank 0's loop over studies (`coordinator`: claim, broadcast, tell, publish), every rank's side of a
trial (`executor`: compile, check, time, agree), the configs compiling ahead of their trials (`ahead`) in
worker processes (`compiler`), where a run's time goes (`phases`), the control traffic between ranks
(`control`), a rank process's entry point (`group`) and rank processes started before their group is
known (`warm`), the supervisor that spawns and restarts a group (`supervisor`), what
makes a rank and all it starts die with the process that started it (`lifeline`), the per-trial
watchdog (`watchdog`), who owns a running trial and what happens when its owner dies (`recovery`),
running a sweep's groups on one node (`runner`), tuning one key from inside a running job (`online`: the one
entry point the run-time path uses), and sweeps (`sweeps/`: sweep files, the registry, progress, ETA, reports).

May import: `tuner/` (studies, search, timing, results, and the shared values `settings` and `keys`), `hardware`,
`db`, `kernels`, `search_spaces`, `errors`. Never `runtime/` (the run-time path imports `online` only).

This `__init__` imports nothing, so importing one module here doesn't pull in the others.
"""
