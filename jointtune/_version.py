"""The package's release, in a module of its own: modules inside the package (the record schema's default
`tuner_version`, the service, bundles) read it here rather than from the package face, whose `__init__` is the
public entry and lazily exports everything else."""

__version__ = "0.1.0"
