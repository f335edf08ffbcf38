"""Tensor-parallel layers over a world, built on the tuned fused ops, and the shapes of a model's ops.

The modules find their configs through `@joint_autotune` as any user code does (`tuned`), run in the
sequence-parallel layout (AG+GEMM / GEMM+RS) or the standard one (local GEMMs, GEMM + all-reduce with the decoder's
residual add and RMSNorm in its epilogue), and compile with `torch.compile(fullgraph=True)` through the registered
torch ops:

    from jointtune.tp import LlamaDecoderLayer, TPDecoder, load_model_config

- `linear`: ColumnParallelLinear, RowParallelLinear;
- `attention`: head-parallel attention; `context`: context-parallel decode attention on Flash-Decode;
- `decoder`: the Llama decoder layer and a stack that picks the layout per token count (`layout`);
- `model_config`: HF config.json files (shipped: llama-3-8b, llama-3-70b, qwen2.5-32b, mixtral-8x7b);
- `shard`: an unsharded HF state dict onto ranks; `reference`: the single-rank reference layer;
- `shapes`: every fused-op shape of a model at a TP degree (what `jointtune tune --model` tunes).
"""

from __future__ import annotations

import jointtune.kernels  # noqa: F401  (chooses Triton's interpreter where there is no GPU, before Triton loads)
from jointtune.tp.attention import HeadParallelAttention
from jointtune.tp.context import ContextParallelDecodeAttention
from jointtune.tp.decoder import LlamaDecoderLayer, TPDecoder
from jointtune.tp.fused_norm import add_rms_norm
from jointtune.tp.kv_cache import KVCache
from jointtune.tp.layout import LayoutRule, measure_layouts
from jointtune.tp.linear import SP, STANDARD, ColumnParallelLinear, RowParallelLinear
from jointtune.tp.model_config import ModelConfig, ModelConfigError, load_model_config, shipped_configs
from jointtune.tp.reference import ReferenceDecoderLayer, rel_error
from jointtune.tp.shapes import OpShape, model_op_shapes
from jointtune.tp.shard import load_hf_state_dict, random_hf_layer, shard_state_dict
from jointtune.tp.tuned import Tuning

__all__ = [
    "SP",
    "STANDARD",
    "ColumnParallelLinear",
    "ContextParallelDecodeAttention",
    "HeadParallelAttention",
    "KVCache",
    "LayoutRule",
    "LlamaDecoderLayer",
    "ModelConfig",
    "ModelConfigError",
    "OpShape",
    "ReferenceDecoderLayer",
    "RowParallelLinear",
    "TPDecoder",
    "Tuning",
    "add_rms_norm",
    "load_hf_state_dict",
    "load_model_config",
    "measure_layouts",
    "model_op_shapes",
    "random_hf_layer",
    "rel_error",
    "shard_state_dict",
    "shipped_configs",
]
