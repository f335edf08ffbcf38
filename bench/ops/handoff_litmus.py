"""Does one thread's release and acquire hand a whole program's data over? A message-passing litmus test, on one GPU
or between two.

Every fused kernel hands data between programs the way `jointtune/kernels/runtime/signals.py` says: the writer's threads
store, a barrier, one thread releases a flag; the reader's one thread acquires it (`wait_flag`, which ends in a
barrier), then every thread loads. Before, each thread also ran a system-scope acq_rel atomic of its own on both
sides. This runs the pattern as the kernels do (the same `wait_flag` and `release_flag`), between pairs of programs
on different SMs, many rounds each:

- the writer stores round r's value over a block of BLOCK ints, then releases flag r;
- the reader loads the block first (so its L1 holds round r - 1: the stale line a missing acquire would return),
  waits for flag r, loads the block again and counts every element that is not r; then acknowledges r, which the
  writer waits for before round r + 1.

MODE "cta" is the kernels' pattern; "thread" adds the old per-thread atomics on both sides (its round trip against
"cta" is what they cost); "no_acquire" (the reader only polls with volatile loads) and "no_barrier" (the writer
releases without the barrier) are controls: a wrong element there shows the test can see what it looks for.
One GPU covers SM-to-SM handoffs at system scope through L1 and L2. On two (torchrun, 2 ranks) every program of
rank 0 is a writer whose stores go over NVLink into rank 1's symmetric buffer, and every program of rank 1 a reader:
the writer's barrier is then what keeps other warps' stores, still in flight over NVLink, ahead of the flag.

    python bench/ops/handoff_litmus.py --out litmus.json [--rounds 20000 --launches 5 --block 2048 --warps 4]
    torchrun --nproc-per-node=2 bench/ops/handoff_litmus.py --out litmus.json [...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.checkout import add_tree_argument  # first: `--tree` picks the jointtune every import below gets

# isort: split

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from common.cuda import device_label, init_cuda_world

from jointtune.kernels.runtime.signals import release_flag, wait_flag

MODES = {"cta": 0, "thread": 1, "no_acquire": 2, "no_barrier": 3}


@triton.jit
def _per_thread_atomics(fence_ptr, pid, THREADS: tl.constexpr):
    tl.atomic_add(fence_ptr + pid * THREADS + tl.arange(0, THREADS), 0, sem="acq_rel", scope="sys")


@triton.jit
def litmus_kernel(data_ptr, flag_ptrs_ptr, flags_ptr, fence_ptr, wrong_ptr, seen_ptr, ROUNDS, n_pairs,
                  ROLE: tl.constexpr, BLOCK: tl.constexpr, THREADS: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    # Pair p's writer ("rank 0") stores block p of `data_ptr` (the reader's buffer, over NVLink with two ranks) and
    # releases flag p at rank 1; the reader acknowledges at rank 0's flag n_pairs + p. `flag_ptrs_ptr` holds every
    # rank's flags as this rank maps them, `flags_ptr` this rank's own. ROLE -1 (one GPU): programs 2p and 2p + 1
    # are pair p's writer and reader, and both "ranks" are this GPU; ROLE 0 / 1: every program is a writer / reader.
    pid = tl.program_id(0)
    pair = pid // 2 if ROLE < 0 else pid
    role = pid % 2 if ROLE < 0 else pid * 0 + ROLE
    offs = pair.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if role == 0:
        for r in range(1, ROUNDS + 1):
            if r > 1:
                wait_flag(flags_ptr + n_pairs + pair, r - 1)  # the reader is done with round r - 1
            tl.store(data_ptr + offs, tl.full((BLOCK,), 0, tl.int32) + r)
            if MODE == 1:
                _per_thread_atomics(fence_ptr, pid, THREADS)
            if MODE == 3:
                flags = tl.load(flag_ptrs_ptr + 1).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(flags + pair, r, sem="release", scope="sys")
            else:
                release_flag(flag_ptrs_ptr, 0, pair, r, 2)
    else:
        wrong = 0
        seen = 0
        for r in range(1, ROUNDS + 1):
            bait = tl.load(data_ptr + offs)  # round r - 1 (or r already): into this SM's L1
            seen += tl.sum((bait == r).to(tl.int32))
            if MODE == 2:
                while tl.load(flags_ptr + pair, volatile=True) < r:
                    pass
            else:
                wait_flag(flags_ptr + pair, r)
            if MODE == 1:
                _per_thread_atomics(fence_ptr, pid, THREADS)
            got = tl.load(data_ptr + offs)
            wrong += tl.sum((got != r).to(tl.int32))
            release_flag(flag_ptrs_ptr, 1, n_pairs + pair, r, 2)
        tl.store(wrong_ptr + pair, wrong)
        tl.store(seen_ptr + pair, seen)


class Rig:
    """The buffers of one run: on one GPU plain tensors that both "ranks" share, on two ranks symmetric buffers
    (the writer stores into rank 1's data through its peer mapping)."""

    def __init__(self, world, pairs: int, block: int, warps: int) -> None:
        dev = torch.device("cuda", torch.cuda.current_device())
        self.world, self.pairs = world, pairs
        if world is None:
            self.data = self.own_data = torch.zeros(pairs * block, dtype=torch.int32, device=dev)
            self.flags = torch.zeros(2 * pairs, dtype=torch.int64, device=dev)
            self.flag_ptrs = torch.tensor([self.flags.data_ptr()] * 2, dtype=torch.int64, device=dev)
            self.role, self.grid = -1, 2 * pairs
        else:
            data = world.symmetric("litmus.data", (pairs * block,), torch.int32, zero=True)
            flags = world.symmetric("litmus.flags", (2 * pairs,), torch.int64, zero=True)
            self.own_data = data.tensors[0]
            self.data = data.peers[0][1]  # the writer's stores land at rank 1; the reader reads its own
            self.flags, self.flag_ptrs = flags.tensors[0], flags.ptrs[0]
            self.role, self.grid = world.rank, pairs
        self.fence = torch.zeros(2 * pairs * 32 * warps, dtype=torch.int32, device=dev)
        self.wrong = torch.zeros(pairs, dtype=torch.int32, device=dev)
        self.seen = torch.zeros(pairs, dtype=torch.int32, device=dev)

    def reset(self) -> None:
        """Zero this rank's data, flags and counts once every rank's last launch is over, then start together."""
        self._barrier()
        for t in (self.own_data, self.flags, self.wrong, self.seen):
            t.zero_()
        self._barrier()

    def _barrier(self) -> None:
        torch.cuda.synchronize()
        if self.world is not None:
            dist.barrier()

    def counts(self) -> tuple[int, int]:
        """(wrong elements, bait loads that saw the new round) summed over ranks (only readers count)."""
        both = torch.stack([self.wrong.sum(), self.seen.sum()]).to(torch.int64)
        if self.world is not None:
            dist.all_reduce(both)
        return int(both[0]), int(both[1])


def run_mode(rig: Rig, mode: str, rounds: int, launches: int, block: int, warps: int) -> dict:
    out = {"mode": mode, "launches": [], "wrong": 0, "handoffs": 0}
    for n in range(launches + 1):  # launch 0 compiles and warms up (not counted)
        rig.reset()
        start = time.perf_counter()
        litmus_kernel[(rig.grid,)](rig.data, rig.flag_ptrs, rig.flags, rig.fence, rig.wrong, rig.seen, rounds,
                                   rig.pairs, ROLE=rig.role, BLOCK=block, THREADS=32 * warps, MODE=MODES[mode],
                                   num_warps=warps)  # fmt: skip
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        w, s = rig.counts()
        if n == 0:
            continue
        out["launches"].append({"wrong_elements": w, "bait_saw_new": s, "us_per_round_trip": seconds / rounds * 1e6})
        out["wrong"] += w
        out["handoffs"] += rig.pairs * rounds
    trips = sorted(x["us_per_round_trip"] for x in out["launches"])
    out["us_per_round_trip_median"] = trips[len(trips) // 2]
    if rig.world is None or rig.world.rank == 0:
        median = out["us_per_round_trip_median"]
        print(f"[{mode}] {out['handoffs']} handoffs of {block} ints: {out['wrong']} wrong elements, "
              f"{median:.2f} us per round trip (median of {launches})", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="handoff_litmus.json")
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--block", type=int, default=2048, help="ints per message (a power of two)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES))
    add_tree_argument(ap)
    args = ap.parse_args()
    if args.block < 32 or args.block & (args.block - 1):
        ap.error(f"--block: must be a power of two >= 32, got {args.block}")
    unknown = sorted(set(args.modes.split(",")) - set(MODES))
    if unknown:
        ap.error(f"--modes: unknown {unknown}; allowed: {', '.join(MODES)}")
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks not in (1, 2):
        ap.error(f"world size: {ranks} ranks; allowed: 1 (python) or 2 (torchrun --nproc-per-node=2)")
    world = init_cuda_world() if ranks == 2 else None
    launcher = "torchrun --nproc-per-node=2" if ranks == 2 else "python"
    result = {
        "device": device_label(ranks),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"{launcher} bench/ops/handoff_litmus.py " + " ".join(sys.argv[1:]),
    }
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    pairs = sms // 2  # every program resident (two per pair on one GPU, one per GPU on two): the spins end
    rig = Rig(world, pairs, args.block, args.warps)
    result.update(ranks=ranks, pairs=pairs, rounds=args.rounds, block=args.block, warps=args.warps, modes=[])
    for mode in args.modes.split(","):
        result["modes"].append(run_mode(rig, mode, args.rounds, args.launches, args.block, args.warps))
        if world is None or world.rank == 0:
            Path(args.out).write_text(json.dumps(result, indent=1))
    if world is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
