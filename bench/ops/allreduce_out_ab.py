"""Torch's symmetric-memory all-reduce into another tensor, two ways, in one run (graph replay, max over ranks, median
of five): in place, then a copy into the output; or its `_out` form writing the output itself. What `World.all_reduce`
with `out=` should call for each variant (GEMM + all-reduce's `baseline` mode returns the sum in the op's output).

    torchrun --nproc-per-node=2 bench/ops/allreduce_out_ab.py --rows 1,64,128 --cols 8192 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,64,128")
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--out", default="allreduce_out_ab.json")
    args = ap.parse_args()
    from common.cuda import init_cuda_world
    from common.measure import capture, graph_ms, max_over_ranks, run_header

    world = init_cuda_world()
    ops, group = torch.ops.symm_mem, dist.group.WORLD.group_name
    result = run_header(world, "bench/ops/allreduce_out_ab.py")
    result["rows"] = {}
    for M in (int(m) for m in args.rows.split(",")):
        ways = {}
        for variant in ("torch_two_shot", "torch_one_shot"):
            (buf,) = world.collective_empty((M, args.cols), torch.bfloat16, variant)
            out = torch.empty(M, args.cols, dtype=torch.bfloat16, device=world.device)
            if variant == "torch_two_shot":
                ways[f"{variant}:in_place_copy"] = lambda b=buf, o=out: (ops.two_shot_all_reduce_(b, "sum", group),
                                                                         o.copy_(b))  # fmt: skip
                ways[f"{variant}:out"] = lambda b=buf, o=out: ops.two_shot_all_reduce_out(b, "sum", group, o)
            else:
                ways[f"{variant}:alloc_copy"] = lambda b=buf, o=out: o.copy_(ops.one_shot_all_reduce(b, "sum", group))
                ways[f"{variant}:out"] = lambda b=buf, o=out: ops.one_shot_all_reduce_out(b, "sum", group, o)
        row = {}
        for name, fn in ways.items():
            fn()
            torch.cuda.synchronize()
            graph = capture(fn, 4)
            times = [graph_ms(graph, world, 20) for _ in range(5)]
            row[name] = round(statistics.median(max_over_ranks(times)) * 1e3, 2)
        result["rows"][M] = row
        if world.rank == 0:
            print(M, row, flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
