"""Every op shape of a model's decoder layer at a TP degree and token counts: what `jointtune tune --model` tunes.

Per token count T (rows of a step: B sequences x L tokens, or B tokens of a decode step), a layer runs:
- sequence-parallel layout (T divisible by TP): `ag_gemm` for QKV (M=T, N=TP * QKV columns per rank, K=hidden) and
  gate_up (N=2 * intermediate), `gemm_rs` for o_proj (N=hidden, K=heads * head_dim) and down (K=intermediate);
  the keys the layers' ops look up, global dims as each family states them;
- standard layout: QKV and gate_up are local GEMMs (nothing to communicate); o_proj and down are GEMM + all-reduce
  (M=T, N=hidden, K global as in gemm_rs) with the decoder's epilogue, the kernel each calls (`decoder.py`):
  o_proj `gemm_ar_rmsnorm` (+ residual, post-attention RMSNorm); down `gemm_ar_rmsnorm` (+ residual, the next
  layer's input RMSNorm: every layer of a stack but the last) and, as op `down_last`, `gemm_ar` (+ residual: the
  stack's last layer). The two kernels keep records of their own, so both are tuned;
- decode attention for T <= `decode_max` (T is then a decode batch) at each KV length: head-parallel, the
  layer's own (`flash_decode` at world size 1 over the rank's H/TP heads and their KV heads; what
  `attn_kernel="flash_decode"` looks up), and/or context-parallel (`flash_decode` at world size TP over all heads,
  the KV split by sequence; `ContextParallelDecodeAttention`).
A MoE model (Mixtral) gets its attention shapes only; its MLP is not a dense layer.

Example:
    >>> from jointtune.tp.model_config import load_model_config
    >>> ops = model_op_shapes(load_model_config("llama-3-70b"), tp=2, tokens=[4096], kv_lens=[])
    >>> [(o.op, o.kernel, o.shape) for o in ops if o.layout == "sp"][:2]
    [('qkv', 'ag_gemm', {'M': 4096, 'N': 10240, 'K': 8192}), ('o_proj', 'gemm_rs', {'M': 4096, 'N': 8192, 'K': 8192})]
    >>> [(o.op, o.kernel) for o in ops if o.layout == "standard" and o.kernel]
    [('o_proj', 'gemm_ar_rmsnorm'), ('down', 'gemm_ar_rmsnorm'), ('down_last', 'gemm_ar')]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from jointtune.tp.model_config import ModelConfig, ModelConfigError

ATTENTION_KINDS = ("head", "context", "both")
DECODE_MAX = 256


@dataclass(frozen=True)
class OpShape:
    """One op of a layer at one token count: which layout runs it, the family tuned for it (None: nothing to
    tune, `note` says why) and the family's key shape at `world_size`."""

    op: str
    layout: str
    tokens: int
    kernel: str | None
    shape: dict[str, int] = field(hash=False)
    world_size: int
    kv_len: int | None = None
    note: str = ""


def row_kernel(*, norm: bool) -> str:
    """The GEMM + all-reduce kernel a standard-layout row-parallel call looks up: with the RMSNorm epilogue or without
    (the name `RowParallelLinear` asks for too, from the family itself)."""
    from jointtune.kernels.gemm_ar import family_name

    return family_name(norm)


#: the standard layout's row-parallel ops: (op, with the RMSNorm epilogue, note)
_STANDARD_ROWS = {
    "o_proj": (("o_proj", True, "+ residual, post-attention RMSNorm"),),
    "down": (
        ("down", True, "+ residual, the next layer's input RMSNorm (every layer but a stack's last)"),
        ("down_last", False, "+ residual (a stack's last layer: no next norm to fuse)"),
    ),
}


def _positive_ints(name: str, values: Sequence[int]) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelConfigError(f"{name}: {v!r} is not allowed; give integers >= 1")
        out.append(v)
    return list(dict.fromkeys(out))


def model_op_shapes(config: ModelConfig, *, tp: int, tokens: Sequence[int], kv_lens: Sequence[int],
                    attention: str = "head", decode_max: int = DECODE_MAX) -> list[OpShape]:  # fmt: skip
    """The ops of one decoder layer of `config` at `tp` ranks, per token count (see the module docstring)."""
    config.check_runnable(attention_only=True)
    config.check_tp(tp)
    if attention not in ATTENTION_KINDS:
        raise ModelConfigError(f"attention: {attention!r} is not allowed; allowed: {', '.join(ATTENTION_KINDS)}")
    tokens, kv_lens = _positive_ints("tokens", tokens), _positive_ints("kv_lens", kv_lens)
    if not tokens:
        raise ModelConfigError("tokens: give at least one token count")
    c, W = config, tp
    hidden, D = c.hidden_size, c.head_dim
    qkv_n, attn_k = W * c.qkv_per_rank(W), c.num_attention_heads * D
    dense = c.moe is None
    out: list[OpShape] = []
    for T in tokens:
        gemms = [("qkv", "col", qkv_n, hidden), ("o_proj", "row", hidden, attn_k)]
        if dense:
            gemms += [("gate_up", "col", 2 * c.intermediate_size, hidden), ("down", "row", hidden, c.intermediate_size)]
        for op, kind, N, K in gemms:
            shape = {"M": T, "N": N, "K": K}
            if T % W:
                out.append(OpShape(op, "sp", T, None, shape, W, note=f"{T} tokens do not divide by TP={W}: standard"))
            else:
                out.append(OpShape(op, "sp", T, "ag_gemm" if kind == "col" else "gemm_rs", shape, W))
        for op, kind, N, K in gemms:
            if kind == "col":
                local = {"M": T, "N": N // W, "K": K}
                out.append(OpShape(op, "standard", T, None, local, W, note="local GEMM, no communication"))
                continue
            for name, norm, note in _STANDARD_ROWS[op]:
                shape = {"M": T, "N": N, "K": K}
                out.append(OpShape(name, "standard", T, row_kernel(norm=norm), shape, W, note=note))
        if not decode_max >= T:
            continue
        for S in kv_lens:
            if attention in ("head", "both"):
                shape = {"B": T, "H": c.heads_per_rank(W), "H_KV": c.kv_heads_per_rank(W), "S": S, "D": D}
                out.append(OpShape("attn", "head", T, "flash_decode", shape, 1, kv_len=S))
            if attention in ("context", "both"):
                shape = {"B": T, "H": c.num_attention_heads, "H_KV": c.num_key_value_heads, "S": S, "D": D}
                out.append(OpShape("attn", "context", T, "flash_decode", shape, W, kv_len=S))
    return out
