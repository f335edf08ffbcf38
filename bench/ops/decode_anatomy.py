"""Where AG+GEMM's and GEMM+RS's time goes at decode sizes, and what a flag between two GPUs costs: the floor a fused
launch competes with (issue 36, "Measure the floor"), in one short run under CUDA-graph replay.

Launch on W GPUs (one process each):

    torchrun --nproc-per-node=W bench/ops/decode_anatomy.py --out decode_anatomy.json [--rows 64,128,16] [--tree DIR]

`--tree` runs another checkout's jointtune (`common.checkout`): the same command on the commit before a change gives
the "before" numbers on the same machine.

`flags`: a Triton ping-pong over NVLink written with the runtime's own signals (`signals.release_ranks`, one fence per
release as the families compile it, and `signals.wait_flag`), flags in the world's symmetric memory; N round trips in
one launch, divided by N (median of a few launches, max over ranks):
- `round_trip`: one program on rank 0 and one on rank 1; `fan_out` (W > 2): rank 0 releases one flag to every peer
  (one fence) and waits for each one's answer, as a pushed chunk's flag goes out;
- `handoff`: P programs on each side, each pair passing its 1/P of a 64x8192 bf16 tile (1 MiB) into the peer's buffer
  before its flag, against the same P pairs passing the flag alone; the difference is what the tile adds.
Each case runs once first with the reader checking every element of every round (0 wrong expected).

Per family (ag_gemm, gemm_rs) and M (default 64, 128, 16) at N = K = 8192, each the max over ranks of the best of
three timings of a graph of 4 calls replayed 20 times (`common.measure.graph_ms`), µs per call:
- `gemm_alone`: `cublas`, this rank's GEMM (ag_gemm: the gathered A [M, K] @ B_r [K, N/W]; gemm_rs: A_r [M, K/W] @
  B_r [K/W, N]); `ours_tile`, our tile GEMM alone: the family's `pull` seed on the same per-rank GEMM, on a world of
  one rank (a process group of its own: no peer, so nothing is sent or waited for; the call's epoch is still read),
  measured for every row at the end of the run (the one part that needs groups of one rank);
- `collective_alone`: the all-gather (ag_gemm) or reduce-scatter (gemm_rs) alone, in each variant the device runs;
- `baseline`: the family's baseline mode (cuBLAS + that collective) in each variant;
- `ours`: the family in each fused mode at the space's seeds and per-mode starts (`Space.seeds`, `Space.mode_starts`).
Every call is checked against the float32 reference, eagerly and after a graph replay into NaN-poisoned outputs,
before it is timed; a config that fails is recorded and not timed.

`floor` says per family and M what a further gain would need (`floor`): the ideal bound max(GEMM alone, collective
alone) against ours and the best unfused path, the cut 1.15x needs, and each fused mode's time over its own GEMM alone
(the tile GEMM for Triton modes, cuBLAS for the others), in µs and in flag round trips. `page` is all of it as text,
printed at the end. The JSON is saved after every item, so a run stopped at its time limit keeps what it measured.

On a lent 4-GPU machine: `bash bench/ops/decode_anatomy_device.sh w4 w2`. Off the GPU, tests/bench/
test_decode_anatomy.py checks the config selection, the floor and the page, runs the ping-pong in Triton's interpreter
between processes and compiles it for sm_90.

Longer than most bench scripts (the ping-pong kernel and its launch, the timing and the report belong together).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common import checkout  # first: it picks the checkout whose jointtune is run

# isort: split

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from jointtune.errors import SpaceError
from jointtune.kernels import create_world, get_family
from jointtune.kernels.runtime.signals import release_ranks, wait_flag
from jointtune.search_spaces import get_space

FAMILIES = ("ag_gemm", "gemm_rs")
N = K = 8192
CALLS, REPLAYS, ROUNDS = 4, 20, 3
TARGET = 1.15  # issue 36's target over the best unfused path
TILE_ROWS, TILE_COLS = 64, 8192
TILE = TILE_ROWS * TILE_COLS  # elements of the handed-off bf16 tile (1 MiB)
BLOCK = 2048  # elements a program moves per step
MAX_PROGRAMS = 128  # program pairs at most (every program resident on an H100's 132 SMs)


# ------------------------------------------------------------------------------------------ the flag ping-pong


@triton.jit(do_not_specialize=["follower", "n_followers", "base", "rounds", "blocks"])
def pingpong_kernel(flag_ptrs_ptr, flags_ptr, data_ptr, src_ptr, wrong_ptr, follower, n_followers, base, rounds, blocks,
                    LEAD: tl.constexpr, DATA: tl.constexpr, CHECK: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # Program p of rank 0 (LEAD) and program p of each follower 1..n_followers play rounds base + 1 .. base + rounds.
    # The leader (DATA: first stores its `blocks` blocks of the tile, this round's tag added, into the follower's
    # buffer as it maps it, `data_ptr`) releases flag p at every follower (one fence, as the families release), then
    # waits for each follower's answer at its own flag f * P + p. A follower waits for flag p (CHECK: then counts the
    # elements of its blocks that are not this round's tag), then answers. `flag_ptrs_ptr`: every rank's flag buffer
    # address, by rank. Values only grow from launch to launch, so no flag is ever reset.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    wrong = pid * 0
    for r in range(1, rounds + 1):
        value = base.to(tl.int64) + r
        tag = (value % 200).to(tl.float32).to(tl.bfloat16)  # exact in bf16, and differs from the last round's
        if LEAD:
            if DATA:
                for j in range(0, blocks):
                    offs = (pid * blocks + j).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # whole blocks: 16-byte stores
                    tl.store(data_ptr + offs, tl.load(src_ptr + offs) + tag)
            release_ranks(flag_ptrs_ptr, pid, value, 1, n_followers, -1)
            for f in range(1, n_followers + 1):
                wait_flag(flags_ptr + f * programs + pid, value)
        else:
            wait_flag(flags_ptr + pid, value)
            if CHECK:
                for j in range(0, blocks):
                    offs = (pid * blocks + j).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
                    wrong += tl.sum((tl.load(data_ptr + offs) != tag).to(tl.int32))
            release_ranks(flag_ptrs_ptr, follower * programs + pid, value, 0, 0, -1)
    tl.store(wrong_ptr + pid, wrong)


class PingPong:
    """Rank 0 and its followers passing flags (and a tile) back and forth, one launch per case (`pingpong_kernel`).

    `flag_ptrs`: every rank's flag buffer address (int64 tensor, by rank); `flags`: this rank's flags (at least
    W * MAX_PROGRAMS int64, zeroed once); `data`: where the tile goes (rank 0: rank 1's buffer as rank 0 maps it; a
    follower: its own buffer); `src`: the tile rank 0 sends (zeros: each round adds its tag). Every rank counts the
    values issued alike (`issued`), whether it takes part in a case or not, so each launch's values exceed every
    flag's and nothing is reset between launches.

    Example (each rank, with buffers from `world.symmetric`; see `flag_costs`):
        >>> pp = PingPong(rank, flags.ptrs[0], flags.tensors[0], data, src)       # doctest: +SKIP
        >>> pp.launch(followers=1, programs=1, rounds=1000)                       # doctest: +SKIP
    """

    def __init__(self, rank: int, flag_ptrs: torch.Tensor, flags: torch.Tensor, data: torch.Tensor, src: torch.Tensor,
                 *, block: int = BLOCK) -> None:  # fmt: skip
        self.rank, self.flag_ptrs, self.flags, self.block = rank, flag_ptrs, flags, block
        self.data, self.src = data, src
        self.wrong = torch.zeros(MAX_PROGRAMS, dtype=torch.int32, device=flags.device)
        self.issued = 0

    def arguments(self, *, followers: int, programs: int, rounds: int, tile: int = 0,
                  check: bool = False) -> dict[str, Any] | None:  # fmt: skip
        """The kernel's arguments for this rank (None where it takes no part: ranks above `followers`); advances the
        values issued on every rank. `tile`: elements handed over per round (0: flags alone; one follower only)."""
        if not 1 <= programs <= MAX_PROGRAMS or (followers + 1) * programs > self.flags.numel():
            raise ValueError(f"programs: {programs} is not allowed with {followers} followers; allowed: 1.."
                             f"{min(MAX_PROGRAMS, self.flags.numel() // (followers + 1))}")  # fmt: skip
        if tile and (
            followers != 1 or tile % (programs * self.block) or tile > min(self.data.numel(), self.src.numel())
        ):
            raise ValueError(f"tile: {tile} elements can't go to {followers} followers in {programs} pieces of whole "
                             f"{self.block}-element blocks within {self.data.numel()} elements")  # fmt: skip
        base, self.issued = self.issued, self.issued + rounds
        if self.rank > followers:
            return None
        lead, blocks = self.rank == 0, tile // (programs * self.block)
        return dict(flag_ptrs_ptr=self.flag_ptrs, flags_ptr=self.flags, data_ptr=self.data, src_ptr=self.src,
                    wrong_ptr=self.wrong, follower=self.rank, n_followers=followers, base=base, rounds=rounds,
                    blocks=blocks, LEAD=lead, DATA=tile > 0, CHECK=check and not lead and tile > 0,
                    BLOCK=self.block)  # fmt: skip

    def launch(self, *, programs: int, **case: Any) -> bool:
        """One launch of `case` (`arguments`'s fields) on `programs` programs; False where this rank takes no part."""
        named = self.arguments(programs=programs, **case)
        if named is None:
            return False
        if named["CHECK"]:
            self.wrong.zero_()
        pingpong_kernel[(programs,)](**named, num_warps=4)
        return True


def flag_cases(world_size: int, programs: list[int], rounds: int, tile_rounds: int) -> dict[str, dict[str, int]]:
    """The ping-pong cases of a run, by name: the round trip, the fan-out (W > 2), and per P the flags alone and the
    tile handoff."""
    cases = {"round_trip": dict(followers=1, programs=1, rounds=rounds)}
    if world_size > 2:
        cases["fan_out"] = dict(followers=world_size - 1, programs=1, rounds=rounds)
    for p in programs:
        cases[f"flags_p{p}"] = dict(followers=1, programs=p, rounds=tile_rounds)
        cases[f"tile_p{p}"] = dict(followers=1, programs=p, rounds=tile_rounds, tile=TILE)
    return cases


def flag_summary(cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The flag costs a reader wants from the timed cases: the round trip, the fan-out, and per P what the tile adds
    (one way: the handoff's round minus half the flag round trip of the same P; bandwidth over that)."""
    us = {name: c.get("us_per_round") for name, c in cases.items()}
    out: dict[str, Any] = {"round_trip_us": us.get("round_trip"), "fan_out_us": us.get("fan_out"), "handoff": []}
    for name in cases:
        if not name.startswith("tile_p"):
            continue
        p = int(name.removeprefix("tile_p"))
        tile, flags = us.get(name), us.get(f"flags_p{p}")
        entry: dict[str, Any] = {"programs": p, "flags_us": flags, "tile_us": tile}
        if tile is not None and flags is not None:
            one_way = tile - flags / 2
            entry.update(tile_adds_us=round(tile - flags, 3), tile_one_way_us=round(one_way, 3),
                         one_way_GBps=round(2 * TILE / one_way / 1e3, 1) if one_way > 0 else None)  # fmt: skip
        out["handoff"].append(entry)
    return out


# ---------------------------------------------------------------------------------------------- the configs


def candidates(space: Any, problem: Any, limits: Any) -> dict[str, dict[str, Any]]:
    """What a row times, by name: our fused configs (the space's seeds, then each mode's start not among them:
    `ours:<mode>`, a second config of one mode `ours:<mode>.2`), then the baseline in every collective variant the
    device runs (`baseline:<variant>`). All canonical and valid for `problem`."""
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for cfg in [*space.seeds(problem, limits), *space.mode_starts(problem, limits)]:
        key = json.dumps(cfg, sort_keys=True)
        if cfg["mode"] == "baseline" or key in seen:
            continue
        seen.add(key)
        name, i = f"ours:{cfg['mode']}", 2
        while name in out:
            name, i = f"ours:{cfg['mode']}.{i}", i + 1
        out[name] = cfg
    base = space.baseline(problem, limits)
    for v in space.param("collective").choices:
        if v in limits.collectives:
            out[f"baseline:{v}"] = space.validate({**base, "collective": v}, problem, limits)
    return out


def tile_alone(family: Any, space: Any, problem: Any, ours: dict[str, dict[str, Any]],
               limits: Any) -> tuple[dict[str, Any], Any] | str:  # fmt: skip
    """(config, problem) of our tile GEMM alone: the first `pull` config of `ours` on the same per-rank GEMM at world
    size 1 (the dim the family splits besides M divided by W); else why not, as text."""
    pulls = [c for c in ours.values() if c["mode"] == "pull"]
    if not pulls:
        return "no pull config among ours"
    W = problem.world_size
    dims = {d: problem.dim(d) for d in family.dims}
    for d in family.split:
        if d != "M":
            dims[d] //= W
    one = space.make_problem(dims, dtype=problem.dtype, world_size=1)
    try:
        return space.validate(pulls[0], one, limits), one
    except SpaceError as exc:
        return f"{json.dumps(pulls[0], sort_keys=True)} at world size 1: {exc}"[:300]


# ---------------------------------------------------------------------------------------------- the report


def floor(row: dict[str, Any], round_trip_us: float | None) -> dict[str, Any]:
    """What a further gain would need at one row: the best unfused path and ours, the ideal bound max(GEMM alone,
    best collective alone), what 1.15x over the best unfused path allows and the cut it needs, and each fused mode's
    time over its own GEMM alone (our tile GEMM for modes with tiles, where measured; else cuBLAS), in µs and in
    flag round trips."""

    def timed(group: str) -> dict[str, float]:
        return {k: e["us"] for k, e in row.get(group, {}).items() if isinstance(e, dict) and "us" in e}

    base, ours = timed("baseline"), timed("ours")
    coll = {k: v for k, v in row.get("collective_alone", {}).items() if isinstance(v, (int, float))}
    cublas = row.get("gemm_alone", {}).get("cublas")
    tile = (row.get("gemm_alone", {}).get("ours_tile") or {}).get("us")
    if not (base and ours and coll and isinstance(cublas, (int, float))):
        return {"incomplete": "needs a timed baseline, a timed fused config, a collective alone and cuBLAS alone"}

    def trips(us: float) -> float | None:
        return round(us / round_trip_us, 1) if round_trip_us else None

    b, o = min(base, key=base.__getitem__), min(ours, key=ours.__getitem__)
    c = min(coll, key=coll.__getitem__)
    ideal = max(cublas, coll[c])
    target = base[b] / TARGET
    modes = {}
    for name, us in sorted(ours.items(), key=lambda kv: kv[1]):
        own = "ours_tile" if "BLOCK_M" in row["ours"][name]["config"] and tile is not None else "cublas"
        gemm = tile if own == "ours_tile" else cublas
        modes[name] = {"us": us, "speedup": round(base[b] / us, 3), "gemm": own, "gemm_alone_us": gemm,
                       "over_gemm_us": round(us - gemm, 2), "over_gemm_round_trips": trips(us - gemm)}  # fmt: skip
    return {
        "best_unfused": b, "best_unfused_us": base[b], "ours": o, "ours_us": ours[o],
        "speedup": round(base[b] / ours[o], 3), "gemm_alone_us": cublas, "collective_alone": c,
        "collective_alone_us": coll[c], "serial_sum_us": round(cublas + coll[c], 2), "ideal_us": ideal,
        "ideal_speedup": round(base[b] / ideal, 3), "target_us": round(target, 2),
        "cut_to_target_us": round(ours[o] - target, 2), "cut_to_target_round_trips": trips(ours[o] - target),
        "target_within_ideal": target >= ideal,
        "tile_gemm_over_cublas_us": round(tile - cublas, 2) if tile is not None else None, "modes": modes,
    }  # fmt: skip


def _num(x: Any, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def _untimed(entry: dict[str, Any]) -> str:
    """Why a config has no time: its error, or how it failed."""
    if "failed" in entry:
        return entry["failed"][:60]
    return f"error {_num(entry.get('error'), 3)} eager, {_num(entry.get('graph_error'), 3)} replayed"


def render(result: dict[str, Any]) -> str:
    """The run as one page of text: flag costs, the table per family, then what a further gain would need."""
    W = result.get("world_size")
    lines = [f"Decode anatomy: {result.get('device')}, W={W}, N=K={N}, bf16, graph replay, µs per call "
             "(max over ranks)"]  # fmt: skip
    flags = result.get("flags") or {}
    summary = flags.get("summary") or {}
    if summary:
        line = f"Flag round trip over NVLink, rank 0 <-> 1: {_num(summary.get('round_trip_us'), 2)} µs"
        if summary.get("fan_out_us") is not None:
            line += (
                f"; rank 0 -> all {W - 1} peers (one fence) and every answer back: {_num(summary['fan_out_us'], 2)} µs"
            )
        lines.append(line)
        for h in summary.get("handoff", []):
            lines.append(f"  {TILE_ROWS}x{TILE_COLS} bf16 tile (1 MiB) in {h['programs']} pieces: round "
                         f"{_num(h.get('tile_us'), 2)} against {_num(h.get('flags_us'), 2)} for the flags alone "
                         f"(+{_num(h.get('tile_adds_us'), 2)}; one way {_num(h.get('tile_one_way_us'), 2)} µs, "
                         f"{_num(h.get('one_way_GBps'))} GB/s)")  # fmt: skip
    elif flags:
        lines.append(f"Flags: {json.dumps(flags)[:200]}")
    needs = []
    for fam, rows in result.get("families", {}).items():
        if not rows:
            continue
        variants = sorted({v.split(":", 1)[1] for r in rows for v in r.get("baseline", {})})
        lines += ["", f"{fam}  (M | cuBLAS | tile GEMM | {'coll' if not variants else ' / '.join(variants)} alone | "
                      f"baseline {' / '.join(variants)} | ideal | ours, best | vs best unfused)"]  # fmt: skip
        for r in rows:
            f = r.get("floor", {})
            coll = " / ".join(_num(r.get("collective_alone", {}).get(v)) for v in variants)
            base = " / ".join(_num(r.get("baseline", {}).get(f"baseline:{v}", {}).get("us")) for v in variants)
            tile = (r.get("gemm_alone", {}).get("ours_tile") or {}).get("us")
            best = f"{f['ours'].removeprefix('ours:')} {_num(f['ours_us'])}" if "ours" in f else "-"
            lines.append(f"  {r['M']:>4} | {_num(r.get('gemm_alone', {}).get('cublas')):>6} | {_num(tile):>6} | "
                         f"{coll} | {base} | {_num(f.get('ideal_us'))} | {best} | "
                         f"{_num(f.get('speedup'), 2)}x")  # fmt: skip
            if "modes" in f:
                over = ", ".join(f"{n.removeprefix('ours:')} {_num(m['us'])} (+{_num(m['over_gemm_us'])} over "
                                 f"{'tile' if m['gemm'] == 'ours_tile' else 'cuBLAS'}, "
                                 f"{_num(m['over_gemm_round_trips'])} RT)" for n, m in f["modes"].items())  # fmt: skip
                reach = "within" if f["target_within_ideal"] else "beyond"
                best = f["ours"].removeprefix("ours:")
                cut = f["cut_to_target_us"]
                if cut > 0:
                    gain = f"cut {_num(cut)} µs ({_num(f['cut_to_target_round_trips'])} flag round trips) from {best}"
                else:
                    gain = f"{best} is there already ({_num(abs(cut))} µs under)"
                notes = ""
                if f.get("tile_gemm_over_cublas_us") is not None:
                    notes += f" Our tile GEMM alone is {_num(f['tile_gemm_over_cublas_us'])} µs over cuBLAS."
                untimed = [f"{k.removeprefix('ours:')} ({_untimed(e)})" for k, e in r.get("ours", {}).items()
                           if isinstance(e, dict) and "us" not in e]  # fmt: skip
                if untimed:
                    notes += f" Not timed: {', '.join(untimed)}."
                needs.append(
                    f"- {fam} M={r['M']}: {TARGET}x the best unfused ({f['best_unfused'].removeprefix('baseline:')} "
                    f"{_num(f['best_unfused_us'])}) means <= {_num(f['target_us'])} µs, {reach} the ideal bound "
                    f"{_num(f['ideal_us'])} (max of GEMM {_num(f['gemm_alone_us'])} and "
                    f"{f['collective_alone']} {_num(f['collective_alone_us'])}; "
                    f"at most {_num(f['ideal_speedup'], 2)}x): {gain}. Over its own GEMM alone: {over}.{notes}"
                )
    if needs:
        lines += ["", "What a further gain would need (RT: flag round trips):", *needs]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- on the GPUs


def graph_us(world: Any, fn: Callable[[], Any]) -> float:
    """GPU time per call under graph replay, best of ROUNDS, max over ranks (µs)."""
    from common.measure import capture, graph_ms, max_over_ranks

    fn()
    graph = capture(fn, CALLS)
    best = min(graph_ms(graph, world, REPLAYS, CALLS) for _ in range(ROUNDS))
    del graph
    return round(max_over_ranks([best * 1e3])[0], 2)


def checked(family: Any, fn: Callable[[], Any], ref: Any) -> dict[str, float]:
    """`fn`'s outputs against the float32 reference, eagerly and after one graph replay into NaN-poisoned outputs
    (relative errors, max over ranks)."""
    from common.measure import max_over_ranks

    outs = fn()
    torch.cuda.synchronize()
    eager = family.max_error(outs, ref)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replay = family.max_error(outs, ref)
    del graph
    eager, replay = max_over_ranks([eager, replay])
    return {"error": eager, "graph_error": replay}


class Rig:
    """One family's inputs at one M on this rank, their float32 reference, and the calls a row times."""

    def __init__(self, family: Any, problem: Any, world: Any) -> None:
        self.family, self.problem, self.world = family, problem, world
        self.x = family.make_inputs(problem, world, seed=11)
        self.ref = family.reference(self.x)
        self.placed: dict[str, list[torch.Tensor]] = {}

    def call(self, config: dict[str, Any]) -> Callable[[], Any]:
        """The call of `config`; a baseline variant that reads A from an NCCL window gets A there (ag_gemm)."""
        inputs, collective = self.x, config.get("collective")
        if self.family.name == "ag_gemm" and config["mode"] == "baseline" and collective not in (None, "nccl"):
            if collective not in self.placed:
                a = self.x.a[0]
                self.placed[collective] = self.world.collective_empty(tuple(a.shape), a.dtype, collective)
                for dst, src in zip(self.placed[collective], self.x.a):
                    dst.copy_(src)
            inputs = dataclasses.replace(self.x, a=self.placed[collective])
        return lambda: self.family.run(inputs, config, self.world)

    def gemm_alone(self) -> Callable[[], Any]:
        """cuBLAS on this rank's GEMM: the gathered A for ag_gemm, the local partial for gemm_rs."""
        x = self.x
        a = torch.cat(list(x.all_a)).contiguous() if self.family.name == "ag_gemm" else x.a[0]
        b = x.b[0]
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        return lambda: torch.mm(a, b, out=c)

    def collective_alone(self, v: str) -> Callable[[], Any]:
        """The family's collective alone in variant `v`, on buffers that variant reads without a copy: the A shards
        gathered (ag_gemm), or the cuBLAS partials reduce-scattered (gemm_rs); the call returns what it made."""
        world, x = self.world, self.x
        M, W, a = self.problem.dim("M"), world.world_size, x.a[0]
        if self.family.name == "ag_gemm":
            shard = world.collective_empty(tuple(a.shape), a.dtype, v)
            for dst, src in zip(shard, x.a):
                dst.copy_(src)
            full = world.collective_empty((M, a.shape[1]), a.dtype, v)
            return lambda: world.all_gather(shard, out=full, collective=v)
        n = x.b[0].shape[1]
        full = world.collective_empty((M, n), a.dtype, v)
        for dst, ai, bi in zip(full, x.a, x.b):
            torch.mm(ai, bi, out=dst)
        rows = world.collective_empty((M // W, n), a.dtype, v)
        return lambda: world.reduce_scatter(full, rows, collective=v) or rows


def solo_world(world: Any) -> Any:
    """A world of this rank alone (a process group of its own), for our tile GEMM with no peer; every rank makes all
    W groups, as torch asks."""
    mine = None
    for r in range(world.world_size):
        group = dist.new_group([r])
        if r == world.rank:
            mine = group
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(mine.group_name)
    except Exception:
        pass
    return create_world("cuda", group=mine)


def precompile(family: Any, jobs: list[tuple[dict[str, Any], Any]]) -> list[str]:
    """Compile the Triton kernels of (config, problem) jobs ahead, four at a time (the tuner's hook); errors as text
    (the first call compiles what failed here)."""
    device = torch.cuda.current_device()

    def one(job: tuple[dict[str, Any], Any]) -> str | None:
        try:
            family.precompile(*job)
        except Exception as exc:
            return f"{json.dumps(job[0], sort_keys=True)}: {type(exc).__name__}: {exc}"[:300]
        return None

    with ThreadPoolExecutor(4, initializer=torch.cuda.set_device, initargs=(device,)) as pool:
        return [e for e in pool.map(one, jobs) if e]


def run_item(label: str, fn: Callable[[], Any], seconds: float, save: Callable[[], None]) -> Any:
    """`fn()` under a watchdog; an exception is its result ({"failed": ...}); the result file is saved after."""
    from common.measure import Watchdog

    with Watchdog(label, seconds):
        try:
            return fn()
        except Exception as exc:
            torch.cuda.synchronize()
            return {"failed": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            save()


def timed_call(world: Any, family: Any, config: dict[str, Any], fn: Callable[[], Any], ref: Any) -> dict[str, Any]:
    """`config`'s call checked against the reference (eager and replayed), then timed if right."""
    entry: dict[str, Any] = {"config": config, **checked(family, fn, ref)}
    tol = family.tolerance("bfloat16")
    if entry["error"] <= tol and entry["graph_error"] <= tol:
        entry["us"] = graph_us(world, fn)
    return entry


def anatomy(world: Any, name: str, M: int, limits: Any, save: Callable[[dict], None], item_s: float) -> dict[str, Any]:
    """One row: cuBLAS alone, every collective variant alone, every baseline variant and our fused configs (our tile
    GEMM alone comes last in the run: `tile_gemm_alone`; its kernel is compiled here with the others)."""
    family = get_family(name)
    space = get_space(family.space)
    problem = space.make_problem({"M": M, "N": N, "K": K}, dtype="bf16", world_size=world.world_size)
    configs = candidates(space, problem, limits)
    ours = {k: c for k, c in configs.items() if k.startswith("ours:")}
    alone = tile_alone(family, space, problem, ours, limits)
    row: dict[str, Any] = {"M": M, "N": N, "K": K, "gemm_alone": {}, "collective_alone": {}, "baseline": {},
                           "ours": {}}  # fmt: skip
    jobs = [(c, problem) for c in ours.values()] + ([alone] if isinstance(alone, tuple) else [])
    row["precompile_errors"] = precompile(family, jobs)
    rig = Rig(family, problem, world)

    def item(label: str, fn: Callable[[], Any]) -> Any:
        return run_item(f"{name} M={M} {label}", fn, item_s, lambda: save(row))

    row["gemm_alone"]["cublas"] = item("cublas alone", lambda: graph_us(world, rig.gemm_alone()))
    for v in (key.split(":", 1)[1] for key in configs if key.startswith("baseline:")):
        row["collective_alone"][v] = item(f"{v} alone", lambda v=v: graph_us(world, rig.collective_alone(v)))
    for key, cfg in configs.items():
        group = "baseline" if key.startswith("baseline:") else "ours"
        row[group][key] = item(key, lambda cfg=cfg: timed_call(world, family, cfg, rig.call(cfg), rig.ref))
    return row


def tile_gemm_alone(world: Any, solo: Any, name: str, M: int, limits: Any) -> dict[str, Any]:
    """Our tile GEMM alone at one row: the family's pull seed on this rank's GEMM, on `solo` (a world of this rank
    alone; every rank runs its own at once, timed as one)."""
    family = get_family(name)
    space = get_space(family.space)
    problem = space.make_problem({"M": M, "N": N, "K": K}, dtype="bf16", world_size=world.world_size)
    ours = {k: c for k, c in candidates(space, problem, limits).items() if k.startswith("ours:")}
    alone = tile_alone(family, space, problem, ours, limits)
    if isinstance(alone, str):
        return {"skipped": alone}
    cfg, one = alone
    x = family.make_inputs(one, solo, seed=11)
    return timed_call(world, family, cfg, lambda: family.run(x, cfg, solo), family.reference(x))


def flag_costs(world: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every ping-pong case: checked once (the reader compares every element of every round), then timed."""
    from common.measure import Watchdog, launch_ms

    W = world.world_size
    flags = world.symmetric("decode_anatomy.flags", (W * MAX_PROGRAMS,), torch.int64, zero=True)
    tile = world.symmetric("decode_anatomy.tile", (TILE,), torch.bfloat16, zero=True)
    data = tile.peers[0][1] if world.rank == 0 else tile.tensors[0]
    src = torch.zeros(TILE, dtype=torch.bfloat16, device=world.device)
    pp = PingPong(world.rank, flags.ptrs[0], flags.tensors[0], data, src)
    programs = [int(p) for p in args.handoff_programs.split(",") if p]
    cases = flag_cases(W, programs, args.rounds, args.tile_rounds)
    out: dict[str, Any] = {"cases": {}, "launches": args.launches}
    for name, case in cases.items():
        entry: dict[str, Any] = dict(case)
        out["cases"][name] = entry
        with Watchdog(f"flags {name}", 60):
            pp.launch(**dict(case, rounds=20), check=True)  # the reader checks every element of 20 rounds
            torch.cuda.synchronize()
            wrong = pp.wrong.sum().to(torch.float64).item() if case.get("tile") else 0.0
            entry["check_rounds"], entry["wrong_elements"] = 20, int(sum_over_ranks(wrong))
            pp.launch(**dict(case, rounds=20))  # compiles the timed form (no check) before its timed launches
            worst = launch_ms(world, lambda case=case: pp.launch(**case), args.launches)
            entry["ms_per_launch"] = [round(x, 4) for x in worst]
            entry["us_per_round"] = round(statistics.median(worst) * 1e3 / case["rounds"], 3)
        if world.rank == 0:
            print(f"flags {name}: {entry['us_per_round']} µs per round, {entry['wrong_elements']} wrong", flush=True)
    out["summary"] = flag_summary(out["cases"])
    return out


def sum_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t)
    return t.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="64,128,16", help="comma-separated M, in the order they run")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--out", default="decode_anatomy.json")
    ap.add_argument("--rounds", type=int, default=2000, help="flag round trips per launch")
    ap.add_argument("--tile-rounds", type=int, default=300, help="rounds per launch of the handoff cases")
    ap.add_argument("--launches", type=int, default=5, help="timed launches per ping-pong case (median)")
    ap.add_argument("--handoff-programs", default="8,32,128", help="program pairs of the handoff cases")
    ap.add_argument("--item-timeout", type=float, default=60.0, help="seconds before an item counts as hung")
    ap.add_argument("--no-flags", action="store_true", help="skip the ping-pong")
    checkout.add_tree_argument(ap)
    args = ap.parse_args()
    unknown = sorted(set(args.families.split(",")) - set(FAMILIES))
    if unknown:
        ap.error(f"--families: unknown {unknown}; allowed: {', '.join(FAMILIES)}")

    from common.cuda import init_cuda_world, spin_up
    from common.measure import max_over_ranks, run_header

    from jointtune.hardware import current_limits

    world = init_cuda_world()
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(dist.group.WORLD.group_name)
    except Exception:
        pass
    limits = current_limits()
    started = time.time()
    result = run_header(world, "bench/ops/decode_anatomy.py")
    result.pop("shapes", None)
    result.update(world_size=world.world_size, tree=str(checkout.TREE), collectives=list(limits.collectives),
                  method={"calls_per_graph": CALLS, "replays": REPLAYS, "rounds": ROUNDS, "target": TARGET,
                          "flag_rounds": args.rounds, "tile_rounds": args.tile_rounds, "launches": args.launches},
                  flags=None, families={f: [] for f in args.families.split(",")})  # fmt: skip

    def save(partial: dict | None = None) -> None:
        if world.rank != 0:
            return
        rt = ((result.get("flags") or {}).get("summary") or {}).get("round_trip_us")
        for rows in result["families"].values():
            for r in rows:
                r["floor"] = floor(r, rt)
        result["seconds"] = round(time.time() - started, 1)
        result["page"] = render(result)
        Path(args.out).write_text(json.dumps(dict(result, **({"partial": partial} if partial else {})), indent=1))

    spin_up(2.0)
    if not args.no_flags:
        try:
            result["flags"] = flag_costs(world, args)
        except Exception as exc:  # every rank fails alike (a compile error, say): the rows still run
            torch.cuda.synchronize()
            result["flags"] = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
        save()
    for M in (int(m) for m in args.rows.split(",")):
        for name in args.families.split(","):
            row = anatomy(world, name, M, limits, save, args.item_timeout)
            result["families"][name].append(row)
            torch.cuda.empty_cache()
            save()
            if world.rank == 0:
                f = row["floor"]
                print(f"{name} M={M}: " + (f"ours {f['ours']} {f['ours_us']} µs, best unfused {f['best_unfused']} "
                      f"{f['best_unfused_us']}, ideal {f['ideal_us']}: {f['speedup']}x" if "ours" in f else
                      json.dumps(f)), flush=True)  # fmt: skip
    # our tile GEMM alone, last: it needs process groups of one rank, the one part not run by the rest of the bench
    try:
        solo = solo_world(world)
    except Exception as exc:
        solo, result["solo_world_error"] = None, f"{type(exc).__name__}: {exc}"[:300]
    if max_over_ranks([0.0 if solo is not None else 1.0])[
        0
    ]:  # all ranks measure it, or none (its timing is collective)
        solo = None
    for name, rows in result["families"].items():
        for row in rows:
            M = row["M"]
            row["gemm_alone"]["ours_tile"] = run_item(
                f"{name} M={M} tile GEMM alone",
                lambda name=name, M=M: (
                    tile_gemm_alone(world, solo, name, M, limits) if solo else {"skipped": "no world of one rank"}
                ),
                args.item_timeout,
                save,
            )
            if world.rank == 0:
                print(f"{name} M={M}: tile GEMM alone {json.dumps(row['gemm_alone']['ours_tile'])[:200]}", flush=True)
    save()
    if world.rank == 0:
        print(result["page"], flush=True)
        print(f"wrote {args.out} in {result['seconds']} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
