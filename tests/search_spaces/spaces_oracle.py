"""The three spaces' rules written out a second time, straight from the spec, as a test oracle.

Deliberately naive (no shared code with the package): which fields a config must have, and which
rules it breaks. Property tests compare the spaces' own answers against these.
"""

from __future__ import annotations

from typing import Any

from jointtune.search_spaces import DeviceLimits, Problem

TILES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "SPLIT_K")
DECODE = ("kv_split", "BLOCK_N", "heads_per_program", "num_warps", "num_stages", "combine_chunks")


def np2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def active_fields(space: str, cfg: dict[str, Any]) -> set[str]:
    """The fields a config with these mode/ce_consumer values must have, per the spec."""
    mode = cfg.get("mode")
    if space == "flash_decode":
        return {"mode", *DECODE} if mode in ("pull", "push") else {"mode"}
    out = {"mode"}
    if mode == "ce":
        out |= {"ce_consumer", "ce_chunks"}
    if mode in ("pull", "push") or (mode == "ce" and cfg.get("ce_consumer") == "triton"):
        out |= set(TILES)
    if mode == "push":
        out |= {"comm_sms", "chunk_m"}
    if space == "ag_gemm" and mode == "push_cublas":
        out |= {"push_by", "gemm_order"}
        if cfg.get("push_by") == "sm":
            out.add("comm_sms")
        if cfg.get("gemm_order") == "local_first":
            out.add("chunk_m")
    if space == "gemm_rs" and mode == "pull":
        out.add("chunk_m")
    return out


def broken_rules(space: str, cfg: dict[str, Any], problem: Problem, lim: DeviceLimits) -> list[str]:
    """Names of the constraints a structurally valid config breaks."""
    d, w, nbytes = problem.dims, problem.world_size, problem.dtype_bytes
    bad = []
    if space == "flash_decode":
        if "kv_split" not in cfg:
            return []
        s_r = -(-d["S"] // w)
        if cfg["kv_split"] > max(256, np2(s_r)):
            bad.append("kv_split")
        if cfg["BLOCK_N"] > cfg["kv_split"]:
            bad.append("block")
        if cfg["num_stages"] > cfg["kv_split"] // cfg["BLOCK_N"]:
            bad.append("stages")
        if cfg["num_warps"] * 8 > cfg["BLOCK_N"]:
            bad.append("warps")
        if 2 * cfg["BLOCK_N"] * d["D"] * nbytes * cfg["num_stages"] > lim.max_shared_mem:
            bad.append("smem")
        if (d["H"] // d["H_KV"]) % cfg["heads_per_program"]:
            bad.append("heads")
        if (d["B"] * d["H"]) % cfg["combine_chunks"]:
            bad.append("combine")
        return bad
    rows = d["M"] // w
    cols = d["N"] // w if space == "ag_gemm" else d["N"]
    depth = d["K"] if space == "ag_gemm" else d["K"] // w
    if "BLOCK_M" in cfg:
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        if (bm * bk + bk * bn) * nbytes * cfg["num_stages"] > lim.max_shared_mem:
            bad.append("smem")
        if bm > max(16, np2(d["M"])) or bn > max(32, np2(cols)) or bk > max(32, np2(depth)):
            bad.append("tile")
        if cfg["num_warps"] == 8 and bm * bn < 8192:
            bad.append("warps")
        if cfg["GROUP_M"] != 1 and cfg["GROUP_M"] > -(-d["M"] // bm):
            bad.append("group")
        if cfg["SPLIT_K"] != 1 and -(-depth // cfg["SPLIT_K"]) < 2 * bk:
            bad.append("split_k")
    if "chunk_m" in cfg and rows % cfg["chunk_m"] and cfg["chunk_m"] != np2(rows):
        bad.append("chunk_m")
    if "comm_sms" in cfg and cfg["comm_sms"] > lim.num_sms // 4:
        bad.append("comm_sms")
    if "ce_chunks" in cfg and cfg["ce_chunks"] > rows:
        bad.append("ce_chunks")
    return bad
