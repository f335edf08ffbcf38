"""Distributed Flash-Decode as serving engines meet it: every mode at its best candidate, against the collective
baseline (our decode kernel + NCCL) and against what a user would write today (per-rank flash attention from
torch, which returns the LSE, + NCCL all-gather of (O, LSE) + a torch combine), in one run; the per-rank decode
kernel against torch's attention and the HBM bound; graph-replay correctness and a mixed stress run with lengths
that change between replays.

Launch: `torchrun --nproc-per-node=2 bench/flash_decode/flash_decode_modes.py --out fd.json [--shapes BxHxH_KVxSxD,...]`

The method is `ag_gemm_modes.py`'s (imported from there): gpu time after a device-side hold and barrier, eager
wall time of back-to-back calls, graph replays of CALLS calls; max over ranks; every candidate checked eagerly
(NaN-poisoned output) and after replays with fresh data against a float32 reference. The reference here is
computed by torch in float32 from each rank's shard (scores, log-sum-exp, softmax times V), all-gathered and
combined exactly: the whole unsharded cache of the large shapes does not fit one GPU (the CPU tests compare with
scaled_dot_product_attention over the unsharded cache).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common import checkout  # noqa: F401  (first: `--tree` picks the jointtune every import below gets)

# isort: split

from common.cuda import Bench, init_cuda_world, spin_up
from common.measure import (
    TOL,
    compiled_call_check,
    copy_bandwidth,
    guarded_measure,
    max_over_ranks,
    measure_only,
    modes_arguments,
    run_header,
    run_shapes,
    save_result,
    shapes_to_time,
    time_candidates,
)
from common.measure import stress as modes_stress

from jointtune.kernels.flash_decode import config_json, flash_decode
from jointtune.kernels.runtime.device import num_sms
from jointtune.kernels.runtime.plan import config_key

H, H_KV, D = 64, 8, 128
SHAPES = [(b, H, H_KV, s, D) for b in (1, 8, 32) for s in (8192, 32768, 131072, 524288)]


class FdRig:
    """One shape's tensors on this rank: q (the same on every rank), its K/V shard, lengths, a static out, and
    fresh-data refills with the float32 reference."""

    def __init__(self, world, B: int, H: int, H_KV: int, S: int, D: int, seed: int = 1234, ragged: bool = False):
        self.world, self.B, self.H, self.H_KV, self.D, self.ragged = world, B, H, H_KV, D, ragged
        self.S_r = S // world.world_size
        self.q = torch.empty(B, H, D, dtype=torch.bfloat16, device="cuda")
        self.k = torch.empty(B, H_KV, self.S_r, D, dtype=torch.bfloat16, device="cuda")
        self.v = torch.empty_like(self.k)
        self.lens = torch.full((B,), self.S_r, dtype=torch.int32, device="cuda")
        self.out = torch.empty(B, H, D, dtype=torch.bfloat16, device="cuda")
        self.ref = torch.empty(B, H, D, dtype=torch.float32, device="cuda")
        self.scale = 1.0 / math.sqrt(D)
        self.seed = seed
        self.refill()

    def refill(self, seed: int | None = None) -> None:
        self.seed = self.seed + 1 if seed is None else seed
        rank = self.world.rank
        gen = torch.Generator(device="cuda").manual_seed(self.seed)
        self.q.copy_(torch.randn(self.q.shape, device="cuda", generator=gen))
        gen_r = torch.Generator(device="cuda").manual_seed(self.seed * 7919 + rank)
        for x in (self.k, self.v):
            for b in range(self.B):  # a batch element at a time: the largest caches are 17 GB per tensor
                x[b].normal_(generator=gen_r)
        if self.ragged:  # any length per rank and sequence, zero included
            self.lens.copy_(torch.randint(0, self.S_r + 1, (self.B,), device="cuda", generator=gen_r))
        self._reference()
        self.out.fill_(float("nan"))

    def _reference(self) -> None:
        B, H, H_KV, D, W = self.B, self.H, self.H_KV, self.D, self.world.world_size
        G = H // H_KV
        packed = torch.empty(B, H, D + 1, device="cuda")
        pos = torch.arange(self.S_r, device="cuda")
        for b in range(B):
            s = torch.matmul(self.q[b].float().view(H_KV, G, D), self.k[b].float().transpose(-1, -2)) * self.scale
            s = s.masked_fill((pos >= self.lens[b])[None, None, :], float("-inf"))
            lse = torch.logsumexp(s, dim=-1)  # [H_KV, G], -inf without keys
            p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
            packed[b, :, :D] = torch.matmul(p, self.v[b].float()).view(H, D)
            packed[b, :, D] = lse.view(H)
        every = torch.empty(W * B, H, D + 1, device="cuda")  # gloo (ranks sharing a GPU) wants dim 0 gathered
        dist.all_gather_into_tensor(every, packed)
        every = every.view(W, B, H, D + 1)
        lse = every[..., D]
        m = lse.max(0).values.nan_to_num(neginf=0.0)
        w = torch.exp(lse - m)
        total = w.sum(0)
        self.ref.copy_((w[..., None] * every[..., :D]).sum(0) / total.clamp_min(1e-30)[..., None])

    def error_on_device(self) -> torch.Tensor:
        return ((self.out.float() - self.ref).norm() / self.ref.norm()).nan_to_num(float("inf")).reshape(1)

    def call(self, config: dict):
        return lambda: flash_decode(self.q, self.k, self.v, self.lens, world=self.world, config=config, out=self.out)


class UserPath:
    """What a user writes today: torch's flash attention per rank (the GQA group as query positions, which gives
    the LSE), NCCL all-gather of (O, LSE) packed in float32, and a torch combine."""

    def __init__(self, rig: FdRig) -> None:
        self.rig = rig
        B, Hq, D, W = rig.B, rig.H, rig.D, rig.world.world_size
        self.qg = rig.q.view(B, rig.H_KV, Hq // rig.H_KV, D)
        self.packed = torch.empty(B * Hq, D + 1, device="cuda")
        self.every = torch.empty(W, B * Hq, D + 1, device="cuda")

    def attention(self):
        r = self.rig
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention(self.qg, r.k, r.v, scale=r.scale)[:2]
        return o, lse

    def __call__(self) -> None:
        r, D = self.rig, self.rig.D
        o, lse = self.attention()
        self.packed[:, :D].copy_(o.reshape(-1, D))
        self.packed[:, D].copy_(lse.reshape(-1))
        dist.all_gather_into_tensor(self.every, self.packed)
        lse_all = self.every[..., D]
        w = torch.exp(lse_all - lse_all.max(0).values)
        o_all = (w[..., None] * self.every[..., :D]).sum(0) / w.sum(0)[..., None]
        r.out.copy_(o_all.view(r.out.shape))


def pow2_at_least(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def two_per_sm_split(items: int, S_r: int, sms: int) -> int:
    """The kv_split (a power of two the space allows) for about two programs per SM: space revision 2's rule."""
    return min(max(64, pow2_at_least(S_r * items / (2 * sms))), 16384, max(64, pow2_at_least(S_r)))


def decode_launch(world, rig: FdRig, config: dict):
    """The decode launch of `config`'s plan for the rig's shapes (built by one earlier call), bound to its tensors:
    the per-rank kernel alone (split-KV and the merge of the splits; no exchange)."""
    plan = next(p for k, p in world.plans.items() if k[0] == "flash_decode" and k[1] == config_key(config)
                and k[2] == rig.q.shape and k[3] == rig.k.shape)  # fmt: skip
    decode = plan.steps[0][0]
    return lambda: decode(rig.q, rig.k, rig.v, rig.lens, rig.out)


def candidates(B: int, S_r: int, sms: int) -> dict[str, list[dict]]:
    """A short list per mode around the space default's split (about 2 programs per SM), whole GQA groups."""
    k0 = two_per_sm_split(B * H // 8, S_r, sms)
    splits = sorted({k for k in (k0 // 4, k0 // 2, k0, k0 * 2) if 64 <= k <= min(16384, max(64, pow2_at_least(S_r)))})
    tile = dict(BLOCK_N=64, heads_per_program=8, num_warps=4, num_stages=2)
    out: dict[str, list[dict]] = {"baseline": [dict(mode="baseline", kv_split=k, **tile) for k in splits]}
    out["fused"] = [dict(mode="fused", kv_split=k, items_per_flag=f, **tile) for k in splits for f in (1, 8)]
    out["pull"] = [dict(mode="pull", kv_split=k0, items_per_flag=f, **tile) for f in (1, 8)]
    out["wait"] = [dict(mode="wait", kv_split=k0, items_per_flag=f, push_programs=8, **tile) for f in (1, 8)]
    return out


def bench_shape(shape: tuple, world, bench: Bench, copy_bw: float, modes: str = "", partial_save=None) -> dict:
    B, Hq, Hkv, S, Dh = shape
    t0 = time.time()
    rig = FdRig(world, *shape)
    big = B * S >= 8 * 131072
    eager_calls, replays = (20, 10) if big else (100, 50)
    entry: dict = {"B": B, "H": Hq, "H_KV": Hkv, "S": S, "D": Dh, "world_size": world.world_size, "anchors": {},
                   "modes": {}}  # fmt: skip

    run = guarded_measure(rig, bench, eager_calls=eager_calls, replays=replays, watchdog_s=150)

    user = UserPath(rig)
    run("sdpa_nccl_combine", user, entry["anchors"])
    entry["anchors"]["sdpa_alone"] = measure_only(rig, user.attention, bench, eager_calls, replays)
    time_candidates(entry, candidates(B, rig.S_r, num_sms(world.device)), run, rig, "x".join(map(str, shape)), modes,
                    partial_save)  # fmt: skip
    # the per-rank decode kernel alone (split-KV and the merge of the splits; no exchange), at baseline's best
    ok = [r for r in entry["modes"].get("baseline", []) if r.get("eager_error", 1) < TOL and "median_ms" in r]
    if ok:
        best = min(ok, key=lambda r: r["median_ms"])
        rig.call(best["config"])()
        entry["anchors"]["decode_kernel_alone"] = dict(
            config=best["config"],
            **measure_only(rig, decode_launch(world, rig, best["config"]), bench, eager_calls, replays),
        )
    kv_bytes = 2 * B * Hkv * rig.S_r * Dh * 2
    entry["anchors"]["hbm_bound_ms"] = kv_bytes / copy_bw * 1e3  # KV bytes read / measured copy bandwidth
    entry["anchors"]["hbm_bound_4tb_ms"] = kv_bytes / 4.0e12 * 1e3  # at the 4.0 TB/s
    base, user_path = entry["modes"].get("baseline", []), entry["anchors"]["sdpa_nccl_combine"]
    summary = {}
    for regime in ("median_ms", "eager_ms", "graph_ms"):
        per_mode = {}
        for mode, results in entry["modes"].items():
            good = [r for r in results if r.get("eager_error", 1) < TOL and r.get("graph_error", 1) < TOL
                    and regime in r]  # fmt: skip
            if good:
                b = min(good, key=lambda r: r[regime])
                per_mode[mode] = {"ms": b[regime], "config": b["config"], "host_us": b.get("host_us")}
        best_mode = min(per_mode, key=lambda m: per_mode[m]["ms"]) if per_mode else None
        ours = per_mode[best_mode]["ms"] if best_mode else None
        user_ms = user_path.get(regime)
        coll = per_mode.get("baseline", {}).get("ms")
        summary[regime] = {
            "per_mode": per_mode, "best_mode": best_mode, "user_path_ms": user_ms, "collective_baseline_ms": coll,
            "speedup_vs_user_path": user_ms / ours if ours and user_ms else None,
            "fused_vs_collective": coll / per_mode["fused"]["ms"] if coll and "fused" in per_mode else None,
        }  # fmt: skip
    entry["best"] = summary
    del base
    entry["seconds"] = time.time() - t0
    if world.rank == 0:
        line = {r: (s["best_mode"], round(s["per_mode"][s["best_mode"]]["ms"], 4) if s["best_mode"] else None,
                    round(s["user_path_ms"] or 0, 4), round(s["speedup_vs_user_path"] or 0, 3),
                    round(s["fused_vs_collective"] or 0, 3)) for r, s in summary.items()}  # fmt: skip
        print(f"[{'x'.join(map(str, shape))}] {entry['seconds']:.0f}s {line} per mode gpu "
              f"{ {m: round(v['ms'], 4) for m, v in summary['median_ms']['per_mode'].items()} } "
              f"decode alone {entry['anchors'].get('decode_kernel_alone', {}).get('median_ms')} sdpa alone "
              f"{entry['anchors']['sdpa_alone'].get('median_ms')} hbm {entry['anchors']['hbm_bound_ms']:.4f}",
              flush=True)  # fmt: skip
    return entry


TILE = dict(BLOCK_N=64, heads_per_program=8, num_warps=4, num_stages=2)
STRESS = [
    ((1, 64, 8, 8192, 128), dict(mode="fused", kv_split=256, items_per_flag=1, **TILE)),
    ((8, 64, 8, 32768, 128), dict(mode="fused", kv_split=1024, items_per_flag=8, **TILE)),
    ((3, 24, 8, 5000, 128), dict(mode="fused", kv_split=128, items_per_flag=2, **dict(TILE, heads_per_program=1))),
    ((1, 64, 8, 8192, 128), dict(mode="pull", kv_split=512, items_per_flag=2, **TILE)),
    # 8,208 programs: a grid many times the SM count (each program hands its partial on through the counters)
    ((2, 64, 8, 131072, 128), dict(mode="fused", kv_split=128, items_per_flag=4, **TILE)),
    ((4, 32, 4, 20000, 64), dict(mode="pull", kv_split=256, items_per_flag=4, **dict(TILE, heads_per_program=4))),
    ((1, 64, 8, 8192, 128), dict(mode="wait", kv_split=256, items_per_flag=1, push_programs=4, **TILE)),
    ((8, 64, 8, 32768, 128), dict(mode="wait", kv_split=2048, items_per_flag=4, push_programs=16, **TILE)),
    ((2, 16, 16, 3000, 256), dict(mode="baseline", kv_split=64, **dict(TILE, BLOCK_N=32, heads_per_program=1))),
    ((8, 64, 8, 32768, 128), dict(mode="baseline", kv_split=1024, **TILE)),
    # GQA groups of 5 and 7 in one program (space revision 3), 128-key steps through 3 stages
    (
        (2, 40, 8, 8192, 128),
        dict(
            mode="fused", kv_split=1024, items_per_flag=2, **dict(TILE, heads_per_program=5, BLOCK_N=128, num_stages=3)
        ),
    ),
    (
        (1, 28, 4, 16384, 128),
        dict(mode="pull", kv_split=512, items_per_flag=1, **dict(TILE, heads_per_program=7, num_stages=3)),
    ),
]


def stress(world, iterations: int) -> dict:
    """ag_gemm_modes' stress run over STRESS; every other case with ragged lengths that change between replays."""
    return modes_stress(world, iterations, STRESS,
                        lambda k, B, Hq, Hkv, S, Dh, seed: FdRig(world, B, Hq, Hkv, S, Dh, seed=seed,
                                                                  ragged=k % 2 == 0))  # fmt: skip


def compiled_module_check(world) -> dict:
    """torch.compile(fullgraph=True) of a module calling torch.ops.jointtune.flash_decode, then CUDA-graph capture
    of the compiled module; every replay (fresh data, new lengths) checked against the reference."""
    cfg = config_json(dict(mode="fused", kv_split=256, items_per_flag=1, **TILE))
    rig = FdRig(world, 2, 64, 8, 16384, 128, seed=4242, ragged=True)

    class Layer(torch.nn.Module):
        def forward(self, q, k, v, lens):
            (o,) = torch.ops.jointtune.flash_decode([q], [k], [v], [lens], world.name, cfg)
            return o * 1.0

    compiled = torch.compile(Layer(), fullgraph=True)
    return compiled_call_check(rig, lambda: rig.out.copy_(compiled(rig.q, rig.k, rig.v, rig.lens)))


def main() -> None:
    ap = modes_arguments("flash_decode_modes.json", "BxHxH_KVxSxD,... (default: batch 1, 8, 32 x S 8K..512K)")
    ap.add_argument("--compile-check", action="store_true", help="torch.compile + graph capture through the op")
    args = ap.parse_args()
    world = init_cuda_world()
    bench = Bench(args.iters, args.warmup, world)
    shapes = shapes_to_time(args, SHAPES)
    result = run_header(world, "bench/flash_decode/flash_decode_modes.py")

    def save() -> None:
        save_result(world, result, args.out)

    spin_up(2.0)
    copy_bw = -max_over_ranks([-copy_bandwidth()])[0]  # the slower rank's
    result["copy_bandwidth_tb_s"] = copy_bw / 1e12
    if args.compile_check:
        result["compiled_module"] = compiled_module_check(world)
        if world.rank == 0:
            print("compiled module", result["compiled_module"], flush=True)
        save()
    if args.stress:
        result["stress"] = stress(world, args.stress)
        if world.rank == 0:
            print("stress", {k: v for k, v in result["stress"].items() if k != "per_config"}, flush=True)
        save()
    run_shapes(world, result, args.out, shapes,
               lambda s, partial: bench_shape(s, world, bench, copy_bw, args.modes, partial))  # fmt: skip


if __name__ == "__main__":
    main()
