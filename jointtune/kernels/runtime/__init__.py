"""The runtime every kernel family shares: where kernels run, the world and its symmetric memory, the signals and
the shared Triton pieces, prepared launches and plans, eager graphs, and the family contract.

Each module has one job and is imported by its path (`jointtune.kernels.runtime.world`); this `__init__` imports
nothing, so a family's version (`version`) hashes only the runtime modules it really uses.
"""
