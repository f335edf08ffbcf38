"""A family's typed launch config, derived from its space: the space declares the knobs once, and the config a
launcher reads is a frozen dataclass of exactly those knobs, typed as their choices are.

A space validates a config and returns its canonical form, which holds only the knobs its mode reads. A launcher
reads a typed value instead of a dict, so every knob needs a value: the subclass names a harmless default for each
knob the space declares without an `implied` value (what a config without it means), and `mode` is always given.
A default for a knob the space doesn't declare, or a knob left without one, is refused when the class is defined.

Example:
    >>> class DecodeConfig(LaunchConfig, space="flash_decode", defaults=dict(
    ...         kv_split=256, BLOCK_N=64, heads_per_program=1, num_warps=4, num_stages=2, items_per_flag=1,
    ...         push_programs=4)):
    ...     pass
    >>> DecodeConfig.of({"mode": "baseline", "collective": "nccl"}).kv_split
    256
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from jointtune.errors import KernelError

C = TypeVar("C", bound="LaunchConfig")


class LaunchConfig:
    """Base of the launch configs; a subclass names its space and the defaults of the knobs a mode may not read."""

    #: the knobs, in the space's order (`mode` first)
    knobs: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, *, space: str, defaults: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from jointtune.search_spaces import get_space

        params = {p.name: p for p in get_space(space).params}
        unknown = sorted(set(defaults) - set(params))
        if unknown:
            raise KernelError(f"{cls.__name__}: defaults for {unknown}, which space {space!r} does not declare")
        if "mode" not in params:
            raise KernelError(f"{cls.__name__}: space {space!r} has no `mode` param")
        annotations: dict[str, Any] = {"mode": str}
        for name, param in params.items():
            if name == "mode":
                continue
            default = defaults.get(name, param.implied)
            if default is None:
                raise KernelError(
                    f"{cls.__name__}: knob {name!r} of space {space!r} needs a default (a mode that doesn't read it "
                    "still gets a value); name one in defaults="
                )
            annotations[name] = type(param.choices[0])
            setattr(cls, name, default)
        cls.__annotations__ = annotations
        cls.knobs = tuple(annotations)
        dataclasses.dataclass(frozen=True)(cls)

    @classmethod
    def of(cls: type[C], canonical: Mapping[str, Any]) -> C:
        """The typed config of a config the space validated: its knobs that the config has, defaults for the rest."""
        return cls(**{k: v for k, v in canonical.items() if k in cls.knobs})
