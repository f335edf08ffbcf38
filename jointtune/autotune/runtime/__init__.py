"""The run-time path: what a decorated launcher or Triton kernel does when it is called.

Owns the decorated objects (`launcher.JointAutotuned`, `triton_compat.JointAutotuner`), the lookup rules
they share (`rules`), where a config for a new key is found (`lookup`: the local store, then the config
service through `client`), how all ranks agree on one (`agreement`), which timing policy a call asks for
(`policies`), and tuning a key from inside a running job (`online`). `jointtune.autotune.decorator` is the
factory that builds the decorated objects.

May import: `jointtune.autotune.settings` and `.keys` (the shared values), `jointtune.hardware`, `db`,
`search_spaces`, `kernels`, `errors`, `timings`. `workers/` (and through it `tuner/`) only inside `online`'s
function, for `on_miss="tune"`; never `sweeps/`. Nothing in `tuner/`, `workers/` or `sweeps/` imports this.

This `__init__` imports nothing, so `import jointtune.autotune.runtime.lookup` doesn't pull in Triton (which
`triton_compat` needs) or torch.
"""
