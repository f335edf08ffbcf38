"""Loading weights: an unsharded Hugging Face state dict of a Llama layer, split onto tensor-parallel ranks.

HF names a layer's weights `model.layers.{i}.self_attn.q_proj.weight` ... `mlp.down_proj.weight`, each [out, in].
A rank's shard, as the layers read it (row-major, the ops' B operand):
- `qkv` [hidden, (H/W + 2 * KV heads of the rank) * head_dim]: the rank's query heads, then its KV heads' K, then V
  (`qkv_bias` the same columns of Qwen2's q/k/v bias);
- `o_proj` [H/W * head_dim, hidden]: the input columns of its query heads;
- `gate_up` [hidden, 2 * I/W]: its I/W gate columns, then the same up columns; `down` [I/W, hidden];
- `input_norm`, `post_norm`: the RMSNorm weights, whole on every rank.

Example:
    >>> from jointtune.tp.model_config import load_model_config
    >>> cfg = load_model_config("llama-3-8b")
    >>> weights = random_hf_layer(cfg, seed=0, dtype=torch.bfloat16, device="meta")   # the layer's HF names
    >>> {k: tuple(v.shape) for k, v in shard_layer(weights, cfg, tp=2, rank=1).items()}["qkv"]
    (4096, 3072)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from jointtune.tp.model_config import ModelConfig, ModelConfigError

PREFIX = "model.layers.{layer}."


def hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of one HF layer (names without the layer prefix) and its shape."""
    c = config
    hidden, D, inter = c.hidden_size, c.head_dim, c.intermediate_size
    q, kv = c.num_attention_heads * D, c.num_key_value_heads * D
    shapes: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q, hidden),
        "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden),
        "self_attn.o_proj.weight": (hidden, q),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    if c.qkv_bias:
        shapes.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    return shapes


def layer_weights(state_dict: Mapping[str, torch.Tensor], config: ModelConfig, *, layer: int = 0,
                  prefix: str = PREFIX) -> dict[str, torch.Tensor]:  # fmt: skip
    """Layer `layer`'s weights from a whole-model state dict, by their names without the prefix; ModelConfigError
    naming the full key of a missing weight or one of the wrong shape."""
    config.check_runnable()
    head = prefix.format(layer=layer)
    out = {}
    for name, shape in hf_shapes(config).items():
        key = head + name
        tensor = state_dict.get(key)
        if tensor is None:
            raise ModelConfigError(f"{key}: missing from the state dict (a {config.name} layer needs it)")
        if tuple(tensor.shape) != shape:
            got, want = list(tensor.shape), list(shape)
            raise ModelConfigError(f"{key}: shape {got} is not allowed; {config.name} needs {want}")
        out[name] = tensor
    return out


def shard_layer(weights: Mapping[str, torch.Tensor], config: ModelConfig, tp: int,
                rank: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """Rank `rank`'s shard of one layer (see the module docstring) from its unsharded weights (`layer_weights`)."""
    config.check_tp(tp)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < tp:
        raise ModelConfigError(f"rank: {rank!r} is not allowed; give 0..{tp - 1}")
    D = config.head_dim
    H_r, KV_r, inter_r = config.heads_per_rank(tp), config.kv_heads_per_rank(tp), config.intermediate_per_rank(tp)
    q_rows = slice(rank * H_r * D, (rank + 1) * H_r * D)
    kv0 = config.kv_head_of_rank(tp, rank)
    kv_rows = slice(kv0 * D, (kv0 + KV_r) * D)
    i_rows = slice(rank * inter_r, (rank + 1) * inter_r)
    w = weights
    qkv = torch.cat([w["self_attn.q_proj.weight"][q_rows], w["self_attn.k_proj.weight"][kv_rows],
                     w["self_attn.v_proj.weight"][kv_rows]])  # fmt: skip
    gate_up = torch.cat([w["mlp.gate_proj.weight"][i_rows], w["mlp.up_proj.weight"][i_rows]])
    shard = {
        "input_norm": w["input_layernorm.weight"].clone(),
        "post_norm": w["post_attention_layernorm.weight"].clone(),
        "qkv": qkv.t().contiguous(),
        "o_proj": w["self_attn.o_proj.weight"][:, q_rows].t().contiguous(),
        "gate_up": gate_up.t().contiguous(),
        "down": w["mlp.down_proj.weight"][:, i_rows].t().contiguous(),
    }
    if config.qkv_bias:
        shard["qkv_bias"] = torch.cat([w["self_attn.q_proj.bias"][q_rows], w["self_attn.k_proj.bias"][kv_rows],
                                       w["self_attn.v_proj.bias"][kv_rows]])  # fmt: skip
    return shard


def shard_state_dict(state_dict: Mapping[str, torch.Tensor], config: ModelConfig, tp: int, *, layer: int = 0,
                     ranks: Any = None, prefix: str = PREFIX) -> list[dict[str, torch.Tensor]]:  # fmt: skip
    """Layer `layer` of an unsharded HF state dict, one shard per rank of `ranks` (default: all `tp` of them)."""
    weights = layer_weights(state_dict, config, layer=layer, prefix=prefix)
    return [shard_layer(weights, config, tp, r) for r in (range(tp) if ranks is None else ranks)]


def random_hf_layer(config: ModelConfig, *, seed: int, dtype: torch.dtype = torch.bfloat16, layer: int | None = None,
                    device: torch.device | str = "cpu", prefix: str = PREFIX) -> dict[str, torch.Tensor]:  # fmt: skip
    """One layer of random weights as at initialisation (linear weights N(0, initializer_range), biases 0, RMSNorm
    weights 1), by HF name: without the prefix, or with it for `layer` (a whole-model state dict's keys).

    Drawn on `device` from `seed`: the same weights on every rank of one device type (so each rank can build its
    shard, and a reference, with no communication), drawn on a GPU in seconds for a 70B layer."""
    meta = torch.device(device).type == "meta"
    gen = torch.Generator(device="cpu" if meta else device).manual_seed(seed)
    head = "" if layer is None else prefix.format(layer=layer)
    out = {}
    for name, shape in hf_shapes(config).items():
        if meta:
            out[head + name] = torch.empty(shape, dtype=dtype, device="meta")
        elif name.endswith("layernorm.weight"):
            out[head + name] = torch.ones(shape, dtype=dtype, device=device)
        elif name.endswith(".bias"):
            out[head + name] = torch.zeros(shape, dtype=dtype, device=device)
        else:
            weight = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            out[head + name] = (weight * config.initializer_range).to(dtype)
    return out


def load_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """An HF checkpoint on the CPU: a `.safetensors` file (needs the safetensors package), a `.bin`/`.pt` file
    (torch.load, weights only, memory-mapped), or a directory of them (every shard merged)."""
    path = Path(path)
    files = (sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ModelConfigError(f"weights: {str(path)!r} is not a checkpoint file or a directory holding some")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise ModelConfigError(f"weights: {str(f)!r} is a safetensors file; install safetensors") from None
            out.update(load_file(str(f), device="cpu"))
        else:
            try:
                out.update(torch.load(f, map_location="cpu", weights_only=True, mmap=True))
            except Exception as exc:  # a corrupt or foreign file: say which one
                raise ModelConfigError(f"weights: {str(f)!r} can't be loaded ({type(exc).__name__}: {exc})") from None
    return out
