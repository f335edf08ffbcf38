"""The run-time path: what a decorated launcher or Triton kernel does when it is called.

Owns `@joint_autotune` (`decorator`, the thin factory), the decorated objects it builds
(`launcher.JointAutotuned`, `triton_compat.JointAutotuner`), the lookup rules they share (`rules`), where a config
for a new key is found (`lookup`: the local store, then the config service through `client`), how all ranks agree
on one (`agreement`), which timing policy a call asks for (`policies`), and tuning a key from inside a running job
(`online`).

May import: the tuner's shared values (`jointtune.autotune.tuner.settings` and `.keys`), `jointtune.hardware`,
`db`, `search_spaces`, `kernels`, `errors`, `timings`; the workers only through their one entry point for online
tuning (`jointtune.autotune.workers.online`), inside `online`'s function, for `on_miss="tune"`. Nothing in `tuner/`
or `workers/` imports this.

This `__init__` imports nothing, so `import jointtune.autotune.runtime.lookup` doesn't pull in Triton (which
`triton_compat` needs) or torch.
"""
