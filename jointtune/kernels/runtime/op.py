"""The op skeleton every family shares, written once: a plan built on the first call, a cheap run on every other.

A family's entry point (`ag_gemm(a, b, *, world, config)`) resolves each call to a launch plan the world keeps
(`World.plan`): the first call of a (world, shapes, dtypes, config, ...) checks the arguments, validates the config
with the family's space (`plan.resolve_config`) and builds the plan; a later call only binds the caller's tensors and
issues it. `FusedOp.call` is that path. A family's op subclasses `FusedOp` with only what is its own: checking its
arguments, what a plan bakes in (its key), building the plan, and its outputs' shape. An op may return several outputs
(`outputs`, such as GEMM + all-reduce's (normed, new residual)), and a family may run two ops over one space (`space`):
the skeleton is the same. The same object gives

- `prepare(...)`: the call bound to its tensors (`Prepared`), whose `run()` re-issues it as a CUDA graph replay would;
- `register()`: the torch op `torch.ops.jointtune.<name>(tensor lists..., world_name, config_json, options...)`, with
  its fake, so torch.compile traces through it and CUDA graphs capture it.

Example (a family's launcher module):
    >>> class AgGemmOp(FusedOp):                                       # doctest: +SKIP
    ...     name, inputs, outputs, bound_in_place = "ag_gemm", ("a", "b"), ("c",), ("a",)
    ...     def check(self, args, world): ...
    >>> OP = AgGemmOp(); OP.register()                                  # doctest: +SKIP
    >>> OP.call((a, b), world, config)                                  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.runtime.calls import as_list, forward_only, parse_config
from jointtune.kernels.runtime.eager_graph import direct_only
from jointtune.kernels.runtime.family import Family
from jointtune.kernels.runtime.world import World, world_named

#: one list of tensors (one per rank this process drives) per argument of the op, in call order
Args = list[list[Any]]
#: an entry point's tensor argument: one tensor (a CUDA rank's), or a list of one per simulated rank
PerRank = torch.Tensor | Sequence[torch.Tensor]


class Prepared:
    """One call with its tensors bound: `run()` issues the same launches again, reading whatever the bound inputs hold
    now and writing the bound outputs, exactly as a CUDA graph replay of the call would (the CPU interpreter's stand-in
    for one). The cheapest repeat call there is: no key, no checks. The bound tensor lists are attributes named as the
    op's arguments, the outputs last (`prepared.a`, `prepared.b`, `prepared.c` of an `ag_gemm` call); `run()` returns
    the output, or the tuple of outputs of an op that has several."""

    def __init__(self, plan: Any, names: Sequence[str], values: Sequence[list[Any]], n_outputs: int,
                 launch: Callable[[Any, Args, Args], Any]) -> None:  # fmt: skip
        self._plan, self._launch, self._inputs = plan, launch, len(names) - n_outputs
        self._bound = operator.attrgetter(*names)
        for name, value in zip(names, values):
            setattr(self, name, value)

    @property
    def plan(self) -> Any:
        """The launch plan this call re-issues, as its world keeps it: for benchmarks that look at its prepared
        launches (`runtime.launch.Launch`, found in its attributes); its layout is the family's own."""
        return self._plan

    def run(self) -> Any:
        bound = self._bound(self)
        n = self._inputs
        self._launch(self._plan, bound[:n], bound[n:])
        return bound[-1] if n == len(bound) - 1 else bound[n:]


class FusedOp(ABC):
    """The entry point, prepared calls and torch op of one family; see the module docstring."""

    #: the op's name: its torch op (`jointtune::<name>`), its family and (unless `space` says) its space
    name: ClassVar[str]
    #: the space its configs come from where that is not its own name's (a second op over one family's space)
    space: ClassVar[str | None] = None
    #: the per-rank tensor arguments, in call order (a trailing optional one may be left out of a call)
    inputs: ClassVar[tuple[str, ...]]
    #: what a prepared call names its outputs, in the order the op returns them (each one tensor per rank; an op of
    #: several returns their tuple, and its `out` is a tuple of one entry per output, None for a new one)
    outputs: ClassVar[tuple[str, ...]] = ("out",)
    #: the inputs a prepared call binds as they are (not copied into place): row-major and 16-byte aligned
    bound_in_place: ClassVar[tuple[str, ...]] = ()
    #: the torch op's arguments after the world and config (schema text), passed to `call` as options by name
    op_options: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: whether the torch op takes its options before the world and config instead (as `gemm_ar_rmsnorm`'s `eps`)
    options_first: ClassVar[bool] = False
    #: whether `out` must have exactly the row-major strides (else: `is_contiguous`, size-1 dims' strides free)
    exact_out_strides: ClassVar[bool] = True

    # ------------------------------------------------------------------------------- what a family supplies

    @abstractmethod
    def check(self, args: Args, world: World) -> None:
        """ShapeError naming the argument for anything a plan can't run (every rank's tensors)."""

    @abstractmethod
    def plan_key(self, world: World, args: Args, config: Mapping[str, Any], **options: Any) -> tuple[Any, Any]:
        """(everything a plan bakes in, where the inputs already are: what `build`, `readable` and `issue` get)."""

    @abstractmethod
    def build(self, world: World, args: Args, config: Mapping[str, Any], placed: Any, **options: Any) -> Any:
        """The plan of a first call: arguments checked, config resolved by the space, buffers and launches made."""

    @abstractmethod
    def out_shape(self, args: Args, world_size: int) -> tuple[int, ...]:
        """The shape of each rank's output (of every output, for an op of several)."""

    def options(self, **options: Any) -> dict[str, Any]:
        """The entry point's options, checked (each becomes part of the plan key where a plan bakes it in)."""
        return options

    def arguments(self, inputs: Sequence[Any]) -> Args:
        """Each argument as a list of one tensor per rank this process drives."""
        return [as_list(x) for x in inputs]

    def recheck(self, args: Args, world: World) -> None:
        """Checks a planned call still needs on every call (what no plan key holds); none by default."""
        return None

    def readable(self, args: Args, placed: Any) -> Args:
        """The arguments as the plan reads them (a copy where one is not row-major and aligned, say)."""
        return args

    def launch(self, plan: Any, args: Args, outs: Args) -> Any:
        """Run the plan on the arguments into the outputs (one list per output), as a call and a prepared call's
        `run()` do; a plan takes them in this order unless its op says."""
        return plan(*args, *outs)

    def issue(self, world: World, key: Any, plan: Any, args: Args, outs: Args, placed: Any, **options: Any) -> Any:
        """Run the plan on the arguments into `outs` (one list per output); what the entry point returns per rank
        (a tuple of them, one per output, for an op of several)."""
        self.launch(plan, args, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    # ------------------------------------------------------------------------------- the skeleton

    def call(self, inputs: Sequence[Any], world: World, config: Mapping[str, Any], out: Any = None,
             **options: Any) -> Any:  # fmt: skip
        """The entry point: one call of the op. One rank's tensors in, its result out; lists (one per simulated
        rank) in, a list out."""
        args = self.arguments(inputs)
        forward_only(self.name, **dict(zip(self.inputs, args)))
        options = self.options(**options)
        if len(world.local_ranks) != 1 or any(len(x) != 1 for x in args):
            self.check(args, world)  # simulated ranks: every rank's tensors, every call (the CPU's path)
        key, placed = self.plan_key(world, args, config, **options)
        plan = world.plans.get(key)
        if plan is None:
            plan = world.plan(key, functools.partial(self.build, world, args, config, placed, **options))
        else:
            self.recheck(args, world)
        args = self.readable(args, placed)
        outs = self.new_outputs(world, args, out)
        result = self.issue(world, key, plan, args, outs, placed, **options)
        if not isinstance(inputs[0], torch.Tensor):
            return result
        return result[0] if len(outs) == 1 else tuple(r[0] for r in result)

    def new_outputs(self, world: World, args: Args, out: Any) -> Args:
        """Each output's list: a new tensor per rank, or the caller's checked (one row-major tensor of the outputs'
        shape each); `out` is one output's tensors, or a tuple of one entry per output for an op of several."""
        shape, x0 = self.out_shape(args, world.world_size), args[0][0]
        several = len(self.outputs) > 1
        given = (None,) * len(self.outputs) if out is None else tuple(out) if several else (out,)
        return [self._output(world, args, o, name if several else "out", shape, x0)
                for name, o in zip(self.outputs, given)]  # fmt: skip

    def _output(self, world: World, args: Args, out: Any, name: str, shape: tuple[int, ...],
                x0: torch.Tensor) -> list[torch.Tensor]:  # fmt: skip
        if out is None:
            return [torch.empty(shape, dtype=x0.dtype, device=world.device) for _ in args[0]]
        outs = as_list(out)
        if len(outs) != len(args[0]) or any(o.shape != shape or o.dtype != x0.dtype or not self._row_major(o, shape)
                                            or o.device != world.device for o in outs):  # fmt: skip
            raise ShapeError(f"{name}: must be one row-major {list(shape)} {x0.dtype} tensor per local rank")
        return outs

    def _row_major(self, o: torch.Tensor, shape: tuple[int, ...]) -> bool:
        if not self.exact_out_strides:
            return o.is_contiguous()
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        return o.stride() == tuple(reversed(strides))

    def prepare(self, *inputs: Any, world: World, config: Mapping[str, Any], out: Any = None,
                **options: Any) -> Prepared:  # fmt: skip
        """Run the op once (building its plan) and return the call, bound to these tensors, to re-issue
        (`Prepared.run`); takes what the entry point takes."""
        args = self.arguments(inputs)
        for name, x in zip(self.inputs, args):
            if name in self.bound_in_place and any(not t.is_contiguous() or t.data_ptr() % 16 for t in x):
                raise ShapeError(f"{name}: must be row-major and 16-byte aligned to be bound to a prepared call")
        result = self.call(args, world, config, out, **options)
        outs = [as_list(result)] if len(self.outputs) == 1 else list(result)
        key, _ = self.plan_key(world, args, config, **self.options(**options))
        return Prepared(world.plans[key], (*self.inputs, *self.outputs), (*args, *outs), len(outs), self.launch)

    # ------------------------------------------------------------------------------- the torch op

    def register(self) -> None:
        """Register `torch.ops.jointtune.<name>`: a list of tensors per argument, the world's name, the config's JSON
        text (`calls.config_json`: a constant under torch.compile), then the options (before the world with
        `options_first`); it returns the output per rank (a tuple of such lists, one per output, for an op of several).
        Its fake gives the outputs' shapes, so torch.compile traces through it."""
        parts = [f"Tensor[] {name}" for name in self.inputs]
        options = [schema for _, schema in self.op_options]
        parts += [*options, "str world", "str config"] if self.options_first else ["str world", "str config", *options]
        returns = "Tensor[]" if len(self.outputs) == 1 else f"({', '.join('Tensor[]' for _ in self.outputs)})"
        schema = f"({', '.join(parts)}) -> {returns}"
        op = torch.library.custom_op(f"jointtune::{self.name}", self._op, mutates_args=(), schema=schema)
        op.register_fake(self._fake)

    def op_inputs(self, lists: Sequence[list[torch.Tensor]]) -> list[Any]:
        """The entry point's inputs from the torch op's tensor lists."""
        return [list(x) for x in lists]

    def _split(self, op_args: Sequence[Any]) -> tuple[list[Any], str, str, dict[str, Any]]:
        n, k = len(self.inputs), len(self.op_options)
        rest = list(op_args[n:])
        values, (world, config) = (rest[:k], rest[k:]) if self.options_first else (rest[2:], rest[:2])
        options = {name: value for (name, _), value in zip(self.op_options, values)}
        return self.op_inputs(op_args[:n]), world, config, options

    def _op(self, *op_args: Any) -> Any:
        inputs, world, config, options = self._split(op_args)
        with direct_only():  # torch.compile's CUDA graphs run through here: no graphs of ours (`eager_graph`)
            result = self.call(inputs, world_named(world), parse_config(config), **options)
        return list(result) if len(self.outputs) == 1 else tuple(list(r) for r in result)

    def _fake(self, *op_args: Any) -> Any:
        lists, world, _, _ = self._split(op_args)
        shape = self.out_shape(lists, world_named(world).world_size)
        outs = tuple([x.new_empty(shape) for x in lists[0]] for _ in self.outputs)
        return outs[0] if len(outs) == 1 else outs


class OpFamily(Family):
    """A family whose launcher is a `FusedOp`, wired once: it is named after its op (and its space, unless the op
    names another), and it runs a config by calling the op on its inputs' tensors, taken by the op's argument names
    (`inputs.a`, `inputs.b`); an op of several outputs gives every rank's first output, then every rank's second."""

    #: the family's op
    op: ClassVar[FusedOp]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        op = cls.__dict__.get("op")
        if op is not None:
            cls.name, cls.space = op.name, op.space or op.name

    def run(self, inputs: Any, config: Mapping[str, Any], world: World) -> Any:
        result = self.op.call(tuple(getattr(inputs, name) for name in self.op.inputs), world, config)
        return result if len(self.op.outputs) == 1 else [x for output in result for x in output]
