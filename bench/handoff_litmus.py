"""Does one thread's release and acquire hand a whole program's data over? A message-passing litmus test on one GPU.

Every fused kernel hands data between programs the way `jointtune/kernels/_signals.py` says: the writer's threads
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
One GPU covers SM-to-SM handoffs at system scope through L1 and L2; NVLink between two GPUs is left to the 2-GPU
stress runs.

    python bench/handoff_litmus.py --out litmus.json [--rounds 20000 --launches 5 --block 2048 --warps 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkout import add_tree_argument  # first: `--tree` picks the jointtune every import below gets

# isort: split

import torch
import triton
import triton.language as tl

from jointtune.kernels._signals import release_flag, wait_flag

MODES = {"cta": 0, "thread": 1, "no_acquire": 2, "no_barrier": 3}


@triton.jit
def _per_thread_atomics(fence_ptr, pid, THREADS: tl.constexpr):
    tl.atomic_add(fence_ptr + pid * THREADS + tl.arange(0, THREADS), 0, sem="acq_rel", scope="sys")


@triton.jit
def litmus_kernel(data_ptr, flag_ptrs_ptr, flags_a_ptr, flags_b_ptr, fence_ptr, wrong_ptr, seen_ptr, ROUNDS,
                  BLOCK: tl.constexpr, THREADS: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    # programs 2p (writer, "rank 0") and 2p + 1 (reader, "rank 1") share block p; flag p of rank 1's flags carries
    # the rounds, flag p of rank 0's the acknowledgements
    pid = tl.program_id(0)
    pair = pid // 2
    offs = pair.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if pid % 2 == 0:
        for r in range(1, ROUNDS + 1):
            if r > 1:
                wait_flag(flags_a_ptr + pair, r - 1)  # the reader is done with round r - 1
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
                while tl.load(flags_b_ptr + pair, volatile=True) < r:
                    pass
            else:
                wait_flag(flags_b_ptr + pair, r)
            if MODE == 1:
                _per_thread_atomics(fence_ptr, pid, THREADS)
            got = tl.load(data_ptr + offs)
            wrong += tl.sum((got != r).to(tl.int32))
            release_flag(flag_ptrs_ptr, 1, pair, r, 2)
        tl.store(wrong_ptr + pair, wrong)
        tl.store(seen_ptr + pair, seen)


def run_mode(mode: str, pairs: int, rounds: int, launches: int, block: int, warps: int) -> dict:
    dev = torch.device("cuda")
    data = torch.zeros(pairs * block, dtype=torch.int32, device=dev)
    flags_a = torch.zeros(pairs, dtype=torch.int64, device=dev)
    flags_b = torch.zeros(pairs, dtype=torch.int64, device=dev)
    flag_ptrs = torch.tensor([flags_a.data_ptr(), flags_b.data_ptr()], dtype=torch.int64, device=dev)
    fence = torch.zeros(2 * pairs * 32 * warps, dtype=torch.int32, device=dev)
    wrong = torch.zeros(pairs, dtype=torch.int32, device=dev)
    seen = torch.zeros(pairs, dtype=torch.int32, device=dev)
    out = {"mode": mode, "launches": [], "wrong": 0, "handoffs": 0}
    for n in range(launches + 1):  # launch 0 compiles and warms up (not counted)
        data.zero_()
        flags_a.zero_()
        flags_b.zero_()
        wrong.zero_()
        seen.zero_()
        torch.cuda.synchronize()
        start = time.perf_counter()
        litmus_kernel[(2 * pairs,)](data, flag_ptrs, flags_a, flags_b, fence, wrong, seen, rounds, BLOCK=block,
                                    THREADS=32 * warps, MODE=MODES[mode], num_warps=warps)  # fmt: skip
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        if n == 0:
            continue
        w, s = int(wrong.sum()), int(seen.sum())
        out["launches"].append({"wrong_elements": w, "bait_saw_new": s, "us_per_round_trip": seconds / rounds * 1e6})
        out["wrong"] += w
        out["handoffs"] += pairs * rounds
    trips = sorted(x["us_per_round_trip"] for x in out["launches"])
    out["us_per_round_trip_median"] = trips[len(trips) // 2]
    print(f"[{mode}] {out['handoffs']} handoffs of {block} ints: {out['wrong']} wrong elements, "
          f"{out['us_per_round_trip_median']:.2f} us per round trip (median of {launches})", flush=True)  # fmt: skip
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
    result = {
        "device": f"1x {torch.cuda.get_device_name()}",
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/handoff_litmus.py " + " ".join(sys.argv[1:]),
    }
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pairs = sms // 2  # 2 programs per pair, all resident: the spins end
    result.update(pairs=pairs, rounds=args.rounds, block=args.block, warps=args.warps, modes=[])
    for mode in args.modes.split(","):
        result["modes"].append(run_mode(mode, pairs, args.rounds, args.launches, args.block, args.warps))
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
