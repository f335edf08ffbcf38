"""The three spaces' rules written out a second time, straight from the spec, as a test oracle.

Deliberately naive (no shared code with the package): which fields a config must have, and which
rules it breaks, by the name each space gives the rule. Property tests compare the spaces' own
answers against these.
"""

from __future__ import annotations

from typing import Any

from jointtune.search_spaces import DeviceLimits, Problem

TILES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "SPLIT_K")
#: flash_decode's decode-kernel knobs: every mode has them (the baseline runs the same decode kernel)
DECODE = ("kv_split", "BLOCK_N", "heads_per_program", "num_warps", "num_stages")
#: flash_decode modes whose partials travel in groups of `items_per_flag` decode items, each with a flag
DECODE_FLAGGED = ("fused", "pull", "wait")
#: gemm_rs modes whose tile GEMM shares its launch with the reduce programs
GEMM_RS_FUSED = ("pull", "push", "atomic")


def np2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def active_fields(space: str, cfg: dict[str, Any]) -> set[str]:
    """The fields a config with these mode/ce_consumer/push_by/gemm_order values must have, per the spec."""
    mode = cfg.get("mode")
    baseline = {"collective"} if mode == "baseline" else set()  # the unfused path's collective variant
    if space == "flash_decode":
        out = {"mode", *DECODE, *baseline}
        if mode in DECODE_FLAGGED:
            out.add("items_per_flag")
        if mode == "wait":
            out.add("push_programs")  # the programs of wait mode's own all-gather push
        return out
    out = {"mode", *baseline}
    if mode == "ce":
        out |= {"ce_consumer", "ce_chunks"}
    triton_ce = mode == "ce" and cfg.get("ce_consumer") == "triton"
    if space == "ag_gemm":
        if mode in ("pull", "push") or triton_ce:
            out |= set(TILES)
        if mode == "push":
            out |= {"comm_sms", "chunk_m"}
        if mode == "barrier":
            out |= {"barrier_sms", "landing"}  # programs pushing, where their rows land
        if mode == "push_cublas":
            out |= {"push_by", "gemm_order"}
            if cfg.get("push_by") == "sm":
                out.add("comm_sms")
            if cfg.get("gemm_order") == "local_first":
                out.add("chunk_m")
        return out
    # gemm_rs
    if mode in GEMM_RS_FUSED or triton_ce:
        out |= set(TILES)
    # push and pull choose who sums the owner's rows; with the epilogue there are no reduce programs and the
    # own rows always come last
    by_programs = mode == "atomic" or (mode in ("pull", "push") and cfg.get("reduce_by") == "programs")
    if mode == "atomic" or (mode in ("pull", "push") and cfg.get("reduce_by") in ("programs", "epilogue")):
        out.add("chunk_m")  # reduce_by=tile flags each tile, not chunks of rows
    if mode in ("pull", "push"):
        out.add("reduce_by")
    if mode == "push" and cfg.get("reduce_by") == "tile":
        out.add("handoff")  # a flag, or LL words (the flag in the data)
    if by_programs:
        out.add("tile_order")
    if mode == "barrier":
        out.add("transport")  # pulled between two meetings, or pushed before one
    if by_programs or mode in ("pull_cublas", "barrier", "ce"):
        out.add("reduce_sms")
    return out


def broken_rules(space: str, cfg: dict[str, Any], problem: Problem, lim: DeviceLimits) -> list[str]:
    """Names of the constraints a structurally valid config breaks (each space's own rule names)."""
    d, w, nbytes = problem.dims, problem.world_size, problem.dtype_bytes
    bad = []
    if "collective" in cfg and cfg["collective"] not in lim.collectives:
        bad.append("collective_available")
    if space == "flash_decode":
        s_r = -(-d["S"] // w)  # every rank holds cdiv(S, W) positions of every sequence
        if cfg["kv_split"] > max(64, np2(s_r)):
            bad.append("kv_split_fits_shard")
        if cfg["BLOCK_N"] > cfg["kv_split"]:
            bad.append("block_fits_split")
        if cfg["num_stages"] > cfg["kv_split"] // cfg["BLOCK_N"]:
            bad.append("stages_need_steps")
        if cfg["num_warps"] * 8 > cfg["BLOCK_N"]:
            bad.append("warps_fit_block")
        if 2 * cfg["BLOCK_N"] * d["D"] * nbytes * cfg["num_stages"] > lim.max_shared_mem:
            bad.append("shared_memory")
        if (d["H"] // d["H_KV"]) % cfg["heads_per_program"]:
            bad.append("heads_divide_group")
        # a decode item is heads_per_program query heads of one sequence: B * H / heads_per_program of them
        # (whole only when heads_per_program divides G; otherwise heads_divide_group is broken already and the
        # count is the spec's floor); a flag's group holds at most all of them, rounded up to a power of two
        if "items_per_flag" in cfg and cfg["items_per_flag"] > np2(d["B"] * d["H"] // cfg["heads_per_program"]):
            bad.append("items_per_flag_fit")
        return bad
    rows = d["M"] // w
    cols = d["N"] // w if space == "ag_gemm" else d["N"]
    depth = d["K"] if space == "ag_gemm" else d["K"] // w
    if "BLOCK_M" in cfg:
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        if (bm * bk + bk * bn) * nbytes * cfg["num_stages"] > lim.max_shared_mem:
            bad.append("shared_memory")
        if bm > max(16, np2(d["M"])):
            bad.append("BLOCK_M_fits_problem")
        if bn > max(32, np2(cols)):
            bad.append("BLOCK_N_fits_problem")
        if bk > max(32, np2(depth)):
            bad.append("BLOCK_K_fits_problem")
        if cfg["num_warps"] == 8 and bm * bn < 8192:
            bad.append("warps_fit_tile")
        if cfg["GROUP_M"] != 1 and cfg["GROUP_M"] > -(-d["M"] // bm):
            bad.append("group_fits_rows")
        if cfg["SPLIT_K"] != 1 and -(-depth // cfg["SPLIT_K"]) < 2 * bk:
            bad.append("split_k_fits_depth")
    if space == "ag_gemm":
        # the all-gather's chunks must tile the rank's rows exactly (or be one chunk of max(16, next_pow2(R)))
        if "chunk_m" in cfg and rows % cfg["chunk_m"] and cfg["chunk_m"] != max(16, np2(rows)):
            bad.append("chunk_divides_rows")
        if "comm_sms" in cfg and cfg["comm_sms"] > lim.num_sms // 4:
            bad.append("comm_sms_budget")
    else:
        # gemm_rs takes a ragged last chunk: a chunk only may not be longer than the rows, rounded up
        if "chunk_m" in cfg and cfg["chunk_m"] > max(16, np2(rows)):
            bad.append("chunk_fits_rows")
        # reduce programs beside a fused GEMM get a quarter of the SMs; after cuBLAS or beside the copy engine, all
        if "reduce_sms" in cfg:
            budget = lim.num_sms // 4 if cfg["mode"] in GEMM_RS_FUSED else lim.num_sms
            if cfg["reduce_sms"] > budget:
                bad.append("reduce_sms_budget")
    if "ce_chunks" in cfg and cfg["ce_chunks"] > rows:
        bad.append("ce_chunks_fit_rows")
    return bad
