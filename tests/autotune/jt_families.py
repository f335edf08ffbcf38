"""Kernel families for the tuner's tests: cheap, deterministic, and some deliberately broken.

Imported by the tests and, by name (`jt_families`), by every spawned rank process, so each
process registers the same spaces and families.

- `jt_sleep`: latency is a sleep whose length depends on the config (best: tile=4, chunk=2, every
  config 20% apart) and scales with the shape's M; some tile/chunk pairs are invalid. Has a
  `precompile` hook. The tuner's clock measures exactly that length (`SimulatedClock`), so what a
  test sees never depends on how busy the machine is. Its one stand-in launch (`NotedKernel`, what a
  compile pool's worker process builds) notes each config a worker built in $JT_COMPILE_LOG, when set.
  With $JT_GRANDCHILDREN set (a file), each process's first `make_inputs` also starts a long-lived
  helper process, as a plug-in might, and appends its pid to that file.
- `jt_faulty`: like jt_sleep with a `variant` knob; with tile=1 a variant fails in one way each:
  raise (a compile error from the precompile hook, and from a compile pool's worker), hang, kill (SIGKILL of
  its own process), wrong (returns wrong numbers). Best: tile=4. Its stand-in launch is jt_sleep's, which
  with $JT_COMPILE_CRASH kills the first worker process that builds a tile=2 config.
- `jt_broken`: the jt_sleep space, but every config raises.
- `jt_matmul`: a real torch matmul whose knobs (row splits, operand order) change its speed.
- `jt_sim_decode`: flash_decode's real joint space (modes, conditions, the shape's constraints) over a simulated
  latency (`sim_decode_ms`, on the SimulatedClock): a tuner's whole search, timing-free.
- `jt_drift`: two configs 2% apart (mode x, the default, 1.02 ms; mode y 1.00 ms) on a machine that slows by 4% for
  good once y has run, as when a neighbour's job starts mid-study: timed once each, x (which runs first) looks
  faster; timed again side by side (the final round), y is. On the SimulatedClock, so no noise decides it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from jointtune.autotune.tuner import timing
from jointtune.db import RecordKey
from jointtune.errors import KernelError
from jointtune.kernels.runtime.family import Family, register_family
from jointtune.search_spaces import Constraint, Space, categorical, choice, pow2, register_space, when

#: configs precompiled in this process, in order (tests read it)
PRECOMPILED: list[dict[str, Any]] = []


class NotedKernel:
    """The one stand-in launch of a test family's config: a compile pool's worker "compiles" it by calling
    `warmup`, which notes the config in $JT_COMPILE_LOG (a file, when set). With $JT_COMPILE_CRASH (a file that does
    not exist yet), the first warmup of a tile=2 config makes that file and kills its process, as a compiler's
    segfault would."""

    def __init__(self, family: str, config: Mapping[str, Any], problem: Any) -> None:
        self.family, self.config, self.problem = family, dict(config), problem

    def launch(self) -> Any:
        return (self, {}, {})

    def warmup(self, *, grid: Any) -> NotedKernel:
        path = os.environ.get("JT_COMPILE_LOG")
        if path:
            line = {"family": self.family, "shape": dict(self.problem.shape), "config": self.config, "pid": os.getpid()}
            with open(path, "a") as handle:
                handle.write(json.dumps(line) + "\n")
        crash = os.environ.get("JT_COMPILE_CRASH")
        if crash and self.config.get("tile") == 2:
            try:
                os.close(os.open(crash, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return self
            os._exit(3)
        return self


def compile_log(path: str, family: str, m: int) -> list[dict[str, Any]]:
    """The configs worker processes built for `family` at M=`m`, in order (`note_compile`)."""
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        lines = [json.loads(text) for text in handle.read().splitlines() if text]
    return [line["config"] for line in lines if line["family"] == family and line["shape"].get("M") == m]


def _tile_chunk(cfg: Mapping[str, Any], ctx: Mapping[str, int]) -> str | None:
    if cfg["tile"] * cfg["chunk"] <= 16:
        return None
    return f"tile*chunk: {cfg['tile']}*{cfg['chunk']} is not allowed; allowed: <= 16"


SLEEP_SPACE = register_space(
    Space(
        "jt_sleep",
        dims=("M",),
        params=[
            categorical("mode", ("baseline", "fast")),
            pow2("tile", 1, 16, when=when(mode="fast")),
            choice("chunk", (1, 2, 4), when=when(mode="fast")),
        ],
        constraints=[Constraint("tile_chunk", ("tile", "chunk"), "tile*chunk <= 16", _tile_chunk)],
        revision=1,
        default=lambda ctx: {"mode": "fast", "tile": 1, "chunk": 1},
    ),
    replace=True,
)


def _variant_rule(cfg: Mapping[str, Any], ctx: Mapping[str, int]) -> str | None:
    if cfg["variant"] == "ok" or cfg["tile"] == 1:
        return None
    return f"variant: {cfg['variant']!r} is not allowed with tile={cfg['tile']}; allowed: 'ok', or any with tile=1"


FAULTY_SPACE = register_space(
    Space(
        "jt_faulty",
        dims=("M",),
        params=[
            categorical("mode", ("baseline", "fast")),
            pow2("tile", 1, 8, when=when(mode="fast")),
            categorical("variant", ("ok", "raise", "hang", "kill", "wrong"), when=when(mode="fast")),
        ],
        constraints=[Constraint("variant_tile", ("variant", "tile"), "variant == 'ok' or tile == 1", _variant_rule)],
        revision=1,
        default=lambda ctx: {"mode": "fast", "tile": 2, "variant": "ok"},
    ),
    replace=True,
)

MATMUL_SPACE = register_space(
    Space(
        "jt_matmul",
        dims=("M", "N", "K"),
        params=[
            categorical("mode", ("baseline", "split")),
            pow2("splits", 1, 8, when=when(mode="split")),
            categorical("order", ("mk", "km"), when=when(mode="split")),
        ],
        revision=1,
        default=lambda ctx: {"mode": "split", "splits": 2, "order": "mk"},
    ),
    replace=True,
)


DRIFT_SPACE = register_space(
    Space(
        "jt_drift",
        dims=("M",),
        params=[categorical("mode", ("baseline", "x", "y"))],
        revision=1,
        default=lambda ctx: {"mode": "x"},
    ),
    replace=True,
)
#: jt_drift's latency (ms) per mode before the machine slows, and how much slower it runs after
DRIFT_MS = {"baseline": 2.0, "x": 1.02, "y": 1.0}
DRIFT_SLOWDOWN = 1.04


def _closeness(tile: int, chunk: int) -> tuple[float, int, int, int]:
    return (abs(math.log2(tile) - 2), abs(chunk - 2), tile, chunk)


#: valid fast (tile, chunk) pairs from best to worst; each is 20% slower than the one before,
#: so timing noise never reorders them
SLEEP_LADDER = sorted(
    ((t, c) for t in (1, 2, 4, 8, 16) for c in (1, 2, 4) if t * c <= 16), key=lambda tc: _closeness(*tc)
)


class SimulatedClock:
    """The tuner's clock (`jointtune.autotune.tuner.timing.time`) in every process that imports this module.

    A timed run of a simulated family lasts exactly its simulated latency on this clock: the run still
    sleeps (watchdogs, kills and time budgets see real time pass), but the clock's next reading is the
    previous one plus the simulated time, so a loaded machine's late wake-ups and slow Python never
    reorder configs 20% apart. Between simulated runs the clock follows real time (other families,
    e.g. jt_matmul, are timed as they run), offset so that it never goes backwards.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._skew = 0.0  # this clock minus time.perf_counter()
        self._last = 0.0
        self._next: float | None = None

    def perf_counter(self) -> float:
        with self._lock:
            real = time.perf_counter()
            if self._next is not None:
                now, self._next = self._next, None
                self._skew = now - real
            else:
                now = real + self._skew
            self._last = now
            return now

    def simulate(self, seconds: float) -> None:
        """Sleep `seconds`; the clock's next reading is exactly `seconds` after its last one."""
        time.sleep(seconds)
        with self._lock:
            self._next = self._last + seconds

    def __getattr__(self, name: str) -> Any:  # everything else is the `time` module's
        return getattr(time, name)


CLOCK = SimulatedClock()
timing.time = CLOCK  # type: ignore[assignment]


def sleep_cost_ms(config: Mapping[str, Any]) -> float:
    """Simulated latency (ms) of a config at M=64: best tile=4, chunk=2 (1 ms); baseline slowest."""
    if config["mode"] == "baseline":
        return 1.2 ** len(SLEEP_LADDER)
    return 1.2 ** SLEEP_LADDER.index((config["tile"], config.get("chunk", 2)))


_GRANDCHILD: list[subprocess.Popen[bytes]] = []


def _start_a_grandchild() -> None:
    path = os.environ.get("JT_GRANDCHILDREN")
    if path and not _GRANDCHILD:
        _GRANDCHILD.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        with open(path, "a") as handle:
            handle.write(f"{_GRANDCHILD[0].pid}\n")


class _Doubling(Family):
    """Outputs 2*x on every rank; latency comes from a sleep; one stand-in launch (`NotedKernel`) per config."""

    dims = ("M",)

    def make_inputs(self, problem: Any, world: Any, *, seed: int) -> Any:
        gen = torch.Generator().manual_seed(seed)
        xs = [torch.randn(problem.dim("M"), generator=gen) for _ in world.local_ranks]
        return {"xs": xs, "scale": problem.dim("M") / 64.0}

    def reference(self, inputs: Any) -> Any:
        return [x * 2 for x in inputs["xs"]]

    def max_error(self, outputs: Any, reference: Any) -> float:
        return max(float((o - r).norm() / r.norm()) for o, r in zip(outputs, reference))

    def standin_launches(self, config: Mapping[str, Any], problem: Any, device: Any) -> list[Any]:
        return [NotedKernel(self.name, config, problem).launch()]


class SleepFamily(_Doubling):
    name = "jt_sleep"
    space = "jt_sleep"

    def make_inputs(self, problem: Any, world: Any, *, seed: int) -> Any:
        _start_a_grandchild()
        return super().make_inputs(problem, world, seed=seed)

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        CLOCK.simulate(sleep_cost_ms(config) * inputs["scale"] / 1e3)
        return [x * 2 for x in inputs["xs"]]

    def precompile(self, config: Mapping[str, Any], problem: Any) -> None:
        PRECOMPILED.append(dict(config))
        time.sleep(0.002)


class FaultyFamily(_Doubling):
    name = "jt_faulty"
    space = "jt_faulty"

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        variant = config.get("variant", "ok")
        if variant == "hang":
            while True:
                time.sleep(0.05)
        if variant == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        CLOCK.simulate(sleep_cost_ms({**config, "chunk": 2}) * inputs["scale"] / 1e3)
        factor = 3 if variant == "wrong" else 2
        return [x * factor for x in inputs["xs"]]

    def precompile(self, config: Mapping[str, Any], problem: Any) -> None:
        if config.get("variant") == "raise":
            raise KernelError("out of resources: shared memory, required: 300000, hardware limit: 232448")

    def standin_launches(self, config: Mapping[str, Any], problem: Any, device: Any) -> list[Any]:
        if config.get("variant") == "raise":
            raise KernelError("out of resources: shared memory, required: 300000, hardware limit: 232448")
        return [NotedKernel(self.name, config, problem).launch()]


class BrokenFamily(_Doubling):
    """Every config fails: a shape the sweep can't tune at all."""

    name = "jt_broken"
    space = "jt_sleep"

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        raise RuntimeError("jt_broken: this family never runs")


class MatmulFamily(Family):
    name = "jt_matmul"
    space = "jt_matmul"
    dims = ("M", "N", "K")

    def make_inputs(self, problem: Any, world: Any, *, seed: int) -> Any:
        gen = torch.Generator().manual_seed(seed)
        M, N, K = (problem.dim(d) for d in self.dims)
        return [(torch.randn(M, K, generator=gen), torch.randn(K, N, generator=gen)) for _ in world.local_ranks]

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        outs = []
        for a, b in inputs:
            if config["mode"] == "baseline":
                outs.append(a @ b)
                continue
            parts = []
            for rows in a.chunk(config["splits"] * 4, dim=0):
                parts.append(rows @ b if config["order"] == "mk" else (b.t() @ rows.t()).t())
            outs.append(torch.cat(parts))
        return outs

    def reference(self, inputs: Any) -> Any:
        return [a @ b for a, b in inputs]

    def max_error(self, outputs: Any, reference: Any) -> float:
        return max(float((o - r).norm() / r.norm()) for o, r in zip(outputs, reference))


_DECODE_MODE_MS = {"fused": 1.0, "pull": 1.12, "wait": 1.3, "baseline": 1.45}
#: (param, the value it costs nothing at, cost per doubling or halving away from it)
_DECODE_TERMS = (("kv_split", 1024, 0.09), ("BLOCK_N", 64, 0.05), ("num_stages", 3, 0.04), ("num_warps", 4, 0.03),
                 ("items_per_flag", 4, 0.03), ("push_programs", 8, 0.02))  # fmt: skip


def sim_decode_ms(config: Mapping[str, Any]) -> float:
    """A structured, deterministic latency (ms) for a flash_decode config: fused mode, 1024-key splits of 64-key
    steps, 3 stages, 4 warps, whole GQA groups per program are best; each step away costs a few percent."""
    factor = 1.0
    for name, best, cost in _DECODE_TERMS:
        if name in config:
            factor += cost * abs(math.log2(config[name] / best))
    factor += 0.04 * math.log2(16 / config["heads_per_program"])
    if config.get("collective") == "nccl_symm":
        factor -= 0.03
    return _DECODE_MODE_MS[config["mode"]] * factor


def _sim_decode_space() -> Space:
    """flash_decode's space under a name of its own (so listings of flash_decode's kernels don't show this one)."""
    from jointtune.search_spaces import FLASH_DECODE
    from jointtune.search_spaces import flash_decode as fd

    return Space("jt_sim_decode", dims=FLASH_DECODE.dims, params=FLASH_DECODE.params,
                 constraints=FLASH_DECODE.constraints, revision=FLASH_DECODE.revision, default=fd._default,
                 derive=fd._derive, check_problem=fd._check_problem, dtypes=FLASH_DECODE.dtypes, starts=fd._starts,
                 stored=fd._stored)  # fmt: skip


SIM_DECODE_SPACE = register_space(_sim_decode_space(), replace=True)


class SimDecodeFamily(_Doubling):
    """flash_decode's space, a simulated latency: what the tuner does with a real space, without timing noise."""

    name = "jt_sim_decode"
    space = "jt_sim_decode"
    dims = ("B", "H", "H_KV", "S", "D")

    def make_inputs(self, problem: Any, world: Any, *, seed: int) -> Any:
        gen = torch.Generator().manual_seed(seed)
        return {"xs": [torch.randn(64, generator=gen) for _ in world.local_ranks], "scale": 1.0}

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        CLOCK.simulate(sim_decode_ms(config) / 1e3)
        return [x * 2 for x in inputs["xs"]]


class DriftFamily(_Doubling):
    """Mode x and y 2% apart on a machine that slows for good once y has run (the module docstring)."""

    name = "jt_drift"
    space = "jt_drift"

    def make_inputs(self, problem: Any, world: Any, *, seed: int) -> Any:
        self.slowed = False  # each study starts on a quiet machine
        return super().make_inputs(problem, world, seed=seed)

    def run(self, inputs: Any, config: Mapping[str, Any], world: Any) -> Any:
        self.slowed = self.slowed or config["mode"] == "y"
        CLOCK.simulate(DRIFT_MS[config["mode"]] * (DRIFT_SLOWDOWN if self.slowed else 1.0) / 1e3)
        return [x * 2 for x in inputs["xs"]]


for _family in (SleepFamily(), FaultyFamily(), BrokenFamily(), MatmulFamily(), SimDecodeFamily(), DriftFamily()):
    register_family(_family)


def stored_best(url: str, family: Family, m: int = 64) -> Any:
    """The store's best record of a simulated family's job at M=m (float32, world size 2, this machine): what a
    tuning run of it published, or None."""
    from jointtune.db import open_store
    from jointtune.hardware import detect
    from jointtune.timings import measured_as

    hardware_id = detect().hardware_id
    timing = measured_as("gpu", hardware_id)  # a run with the default (gpu) policy: interp in the CPU interpreter
    return open_store(url).best(RecordKey(kernel=family.name, kernel_version=family.version, shape={"M": m},
                                          dtype="float32", world_size=2, hardware_id=hardware_id,
                                          timing=timing))  # fmt: skip
