"""Flags carried in the data (`jointtune.kernels.runtime.ll`) against fenced flags (`runtime.signals`), between two
GPUs: what a handoff costs each way, and whether a reader ever takes a stale or torn word.

Launch on two or more GPUs (ranks 0 and 1 play; the rest idle):

    torchrun --nproc-per-node=2 bench/ops/ll_litmus.py --out ll_litmus.json

Cases, each a ping-pong of R rounds in one launch, P program pairs, µs per round (median of a few launches, max over
ranks); rank 0 hands `elements` bf16 values (split over the P programs) to rank 1, which answers with one word or flag
per program:
- `fenced`: decode_anatomy's `PingPong` (the families' handoff: stores, one system-scope fence, a flag; the reader
  polls and acquires the flag, then loads);
- `ll`: the values as LL words (two bf16 per 64-bit word, the round's tag in the other half; the reader polls the
  words themselves), the answer one LL word; without data rank 0 sends one word (the flag alone). `--store` picks the
  writer's stores for a comparison: `ll_store` (st.relaxed.sys, what the families use), plain stores, or a relaxed
  system-scope exchange per word.
Before it is timed every case runs checked: the reader compares every value of every round with what the round sent
(`wrong`: 0 expected), so a torn or stale word shows up as a count. One-way cost of the data: the round minus half of
the same P's round without data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from jointtune.kernels.runtime.ll import ll_data, ll_store, ll_tag, ll_wait, ll_word

BLOCK = 512  # words a program moves per step
MAX_PROGRAMS = 128
MAX_WORDS = 1 << 19  # 4 MiB of words: a 64x8192 bf16 tile is 256K words
FENCED_BLOCKS = (8, 32, 128, 512, 2048)  # elements a fenced program moves per step


@triton.jit
def _put(ptrs, words, mask, STORE: tl.constexpr):
    # how the writer stores: `ll_store` (0), a plain store (1), a relaxed system-scope exchange per word (2)
    if STORE == 0:
        ll_store(ptrs, words, mask)
    elif STORE == 1:
        tl.store(ptrs, words, mask=mask)
    else:
        tl.atomic_xchg(ptrs, words, mask=mask, sem="relaxed", scope="sys")


@triton.jit(do_not_specialize=["base", "rounds", "words"])
def ll_pingpong_kernel(to_peer_ptr, back_peer_ptr, to_own_ptr, back_own_ptr, wrong_ptr, base, rounds, words,
                       LEAD: tl.constexpr, BLOCK: tl.constexpr, STORE: tl.constexpr):  # fmt: skip
    # Program p of rank 0 (LEAD) stores its `words` words of round r into rank 1's `to` region (as rank 0 maps it),
    # then waits for rank 1's answer word p in its own `back` region; program p of rank 1 waits for its words,
    # counts those whose data are not what round r sent, then answers. Rounds base + 1 .. base + rounds: the tags
    # grow from launch to launch, so nothing is reset.
    pid = tl.program_id(0)
    one = tl.arange(0, 2)
    one_mask = one < 1
    wrong = pid * 0
    for r in range(1, rounds + 1):
        tag = ll_tag(base + r)
        if LEAD:
            for j0 in range(0, words, BLOCK):
                idx = j0 + tl.arange(0, BLOCK)
                offs = pid.to(tl.int64) * words + idx
                _put(to_peer_ptr + offs, ll_word((offs * 3 + r).to(tl.int32), tag), idx < words, STORE)
            ll_wait(back_own_ptr + pid + one, one_mask, tag)
        else:
            for j0 in range(0, words, BLOCK):
                idx = j0 + tl.arange(0, BLOCK)
                offs = pid.to(tl.int64) * words + idx
                mask = idx < words
                got = ll_wait(to_own_ptr + offs, mask, tag)  # always read: see `ll_wait`
                wrong += tl.sum((mask & (ll_data(got) != (offs * 3 + r).to(tl.int32))).to(tl.int32))
            _put(back_peer_ptr + pid + one, ll_word(one.to(tl.int32), tag), one_mask, STORE)
    tl.store(wrong_ptr + pid, wrong)


class LLPingPong:
    """Rank 0 and rank 1 passing LL words (`ll_pingpong_kernel`), a launch per case. `buf`: the world's symmetric
    int64 buffer of MAX_WORDS + MAX_PROGRAMS words per rank (zeroed once: tags start at 1)."""

    def __init__(self, rank: int, buf: Any, store: int = 0) -> None:
        self.rank, self.store = rank, store
        own = buf.tensors[0]
        peer = buf.peers[0][1 - rank] if rank < 2 else own
        self.to_own, self.back_own = own[:MAX_WORDS], own[MAX_WORDS:]
        self.to_peer, self.back_peer = peer[:MAX_WORDS], peer[MAX_WORDS:]
        self.wrong = torch.zeros(MAX_PROGRAMS, dtype=torch.int32, device=own.device)
        self.issued = 0

    def launch(self, *, programs: int, rounds: int, elements: int, check: bool = False) -> bool:
        words = max(1, elements // 2 // programs)  # without data, one word: the flag alone
        if elements % (2 * programs) or words * programs > MAX_WORDS:
            raise ValueError(f"elements: {elements} can't go in {programs} programs of whole words")
        base, self.issued = self.issued, self.issued + rounds
        if self.rank > 1:
            return False
        if check:
            self.wrong.zero_()
        ll_pingpong_kernel[(programs,)](self.to_peer, self.back_peer, self.to_own, self.back_own, self.wrong, base,
                                        rounds, words, LEAD=self.rank == 0,
                                        BLOCK=BLOCK, STORE=self.store, num_warps=4)  # fmt: skip
        return True


def cases(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    out = {"fenced_p1": dict(kind="fenced", programs=1, rounds=args.rounds, elements=0),
           "ll_p1": dict(kind="ll", programs=1, rounds=args.rounds, elements=0)}  # fmt: skip
    for e in (int(x) for x in args.elements.split(",")):
        for p in (int(x) for x in args.programs.split(",")):
            for kind in ("fenced", "ll"):
                out[f"{kind}_p{p}_flags"] = dict(kind=kind, programs=p, rounds=args.tile_rounds, elements=0)
                out[f"{kind}_p{p}_e{e}"] = dict(kind=kind, programs=p, rounds=args.tile_rounds, elements=e)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="ll_litmus.json")
    ap.add_argument("--rounds", type=int, default=2000, help="round trips per launch, one program pair")
    ap.add_argument("--tile-rounds", type=int, default=300, help="rounds per launch with data")
    ap.add_argument("--elements", default="1024,65536,524288", help="bf16 values handed over per round")
    ap.add_argument("--programs", default="32,128", help="program pairs of the data cases")
    ap.add_argument("--check-rounds", type=int, default=200, help="checked rounds before each case is timed")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--store", type=int, default=0, help="LL stores: 0 ll_store, 1 plain, 2 relaxed exchange")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()

    from common.cuda import init_cuda_world, spin_up
    from common.measure import Watchdog, launch_ms, max_over_ranks, run_header

    from ops.decode_anatomy import PingPong

    world = init_cuda_world()
    rank, W = world.rank, world.world_size
    result = run_header(world, "bench/ops/ll_litmus.py")
    result.update(world_size=W, store=("ll_store", "plain", "relaxed exchange")[args.store], cases={})
    flags = world.symmetric("ll_litmus.flags", (W * MAX_PROGRAMS,), torch.int64, zero=True)
    tile = world.symmetric("ll_litmus.tile", (MAX_WORDS * 2,), torch.bfloat16, zero=True)
    data = tile.peers[0][1] if rank == 0 else tile.tensors[0]
    src = torch.zeros(MAX_WORDS * 2, dtype=torch.bfloat16, device=world.device)
    ll_buf = world.symmetric("ll_litmus.words", (MAX_WORDS + MAX_PROGRAMS,), torch.int64, zero=True)
    # one fenced ping-pong for every case (its flag values grow across them all); its block fits each case's share
    fenced = PingPong(rank, flags.ptrs[0], flags.tensors[0], data, src)
    ll = LLPingPong(rank, ll_buf, args.store)
    spin_up(2.0)

    def player(case: dict[str, int]) -> Any:
        """The ping-pong that plays `case` (the fenced one with the largest block that divides each program's share)."""
        if case["kind"] == "ll":
            return ll
        e, p = case["elements"], case["programs"]
        fenced.block = max(b for b in FENCED_BLOCKS if not e or e % (p * b) == 0)
        return fenced

    def run(case: dict[str, int], check: bool) -> bool:
        p, e, rounds = case["programs"], case["elements"], case["rounds"]
        if case["kind"] == "ll":
            return ll.launch(programs=p, rounds=rounds, elements=e, check=check)
        return player(case).launch(followers=1, programs=p, rounds=rounds, tile=e, check=check)

    def settle(name: str) -> None:
        """Wait up to 20 s for this rank's launches; a hang prints what the LL words hold, then ends the process."""
        deadline = time.time() + 20
        while not torch.cuda.current_stream().query():
            if time.time() > deadline:
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    own = ll_buf.tensors[0]
                    seen = [hex(v) for v in own[:4].cpu().tolist()] + [
                        hex(v) for v in own[MAX_WORDS : MAX_WORDS + 4].cpu().tolist()
                    ]
                print(f"rank {rank}: {name} hung; to[0:4], back[0:4] = {seen}", flush=True)
                os._exit(4)
            time.sleep(0.01)

    only = set(filter(None, args.only.split(",")))
    for name, case in cases(args).items():
        if only and name not in only:
            continue
        entry: dict[str, Any] = dict(case)
        result["cases"][name] = entry
        try:
            with Watchdog(f"ll_litmus {name}", 90):
                run(dict(case, rounds=args.check_rounds), True)
                settle(name)
                count = player(case).wrong.sum().item() if (case["elements"] and rank == 1) else 0
                entry["check_rounds"] = args.check_rounds
                entry["wrong"] = int(max_over_ranks([float(count)])[0])
                run(dict(case, rounds=20), False)
                worst = launch_ms(world, lambda case=case: run(case, False), args.launches)
                entry["us_per_round"] = round(statistics.median(worst) * 1e3 / case["rounds"], 3)
        except Exception as exc:
            torch.cuda.synchronize()
            entry["failed"] = f"{type(exc).__name__}: {exc}"[:300]
        if rank == 0:
            print(f"{name}: {entry.get('us_per_round')} µs per round, wrong {entry.get('wrong')}"
                  f"{' ' + entry['failed'] if 'failed' in entry else ''}", flush=True)  # fmt: skip
            Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
