"""Distributed Flash-Decode: decode attention over a KV cache sharded by sequence across ranks, with the exchange
of partial results fused in.

Queries q [B, H, D] are on every rank; rank r holds K and V [B, H_KV, S_r, D] for its share of every sequence's
positions, and `kv_lens` [B] (int32 or int64, on the device) says how many of them are valid on this rank, per
sequence (a ragged batch; positions past it are ignored; None means all S_r). Attention does not depend on the
order of keys, so any split of a sequence over the ranks works: contiguous shards, round-robin, or what a cache
manager hands out. Grouped-query attention: H is a multiple of H_KV. Each rank computes split-KV partial outputs
and base-2 log-sum-exps in float32; the ranks' partials are combined, weighted by LSE, into the full output
[B, H, D] on every rank. A sequence with no valid keys on any rank gets zeros (SDPA would give NaN).

`mode` picks how the partials meet (see `_flash_decode_plans`): `fused` (pushed from the decode kernel, combined in
the same launch), `pull`, `wait` (our own all-gather push, per-chunk waits) or `baseline` (NCCL all-gather).
Lengths live in device memory, so a captured CUDA graph serves any lengths; nothing a later call needs comes
from the host (capture after one eager call of the same shapes and config).

Three ways in:
    flash_decode(q, k, v, kv_lens, world=world, config=cfg)                     # eager, the cheapest host path
    torch.ops.jointtune.flash_decode([q], [k], [v], [kv_lens], world.name, cfg_json)  # torch.compile / graphs
    get_family("flash_decode")                                                  # tuner, decorator, benchmarks
"""

from jointtune.kernels.flash_decode.launcher import (
    FlashDecodeFamily,
    PreparedFlashDecode,
    config_json,
    flash_decode,
    prepare,
    reference,
)

__all__ = ["FlashDecodeFamily", "PreparedFlashDecode", "config_json", "flash_decode", "prepare", "reference"]
