"""jointtune: one search space for the compute tiles and the communication knobs of fused
multi-GPU kernels, tuned on all ranks at once, stored and served per kernel, shape and hardware."""

from jointtune.errors import JointtuneError

__version__ = "0.1.0"

__all__ = ["JointtuneError", "__version__"]
