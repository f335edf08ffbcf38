"""Helpers of the tensor-parallel tests: small configs, random HF-layout weights of a whole model."""

from __future__ import annotations

from pathlib import Path

import torch

from jointtune.tp.model_config import ModelConfig, model_config_from_dict
from jointtune.tp.shard import random_hf_layer

#: GQA (2 query heads per KV head), Qwen2's q/k/v bias, weights 5x the usual init so the layer's own work is a large
#: part of its output (a residual stream that passes through unchanged would hide a wrong layer)
SMALL = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
         "initializer_range": 0.1}  # fmt: skip


def small_config(**changes: object) -> ModelConfig:
    return model_config_from_dict({**SMALL, **changes}, name="small")


def hf_checkpoint(config: ModelConfig, layers: int, *, seed: int) -> dict[str, torch.Tensor]:
    """A whole-model state dict of `layers` random layers (HF names), with norm weights and biases that are not
    1 and 0, so a wrongly sharded bias or norm shows."""
    gen = torch.Generator().manual_seed(seed + 1000)
    state = {}
    for layer in range(layers):
        for name, tensor in random_hf_layer(config, seed=seed + layer, layer=layer).items():
            if "layernorm" in name or name.endswith(".bias"):
                tensor = (tensor.float() + 0.2 * torch.randn(tensor.shape, generator=gen)).bfloat16()
            state[name] = tensor
    return state


def layer_of(state: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    head = f"model.layers.{layer}."
    return {k[len(head) :]: v for k, v in state.items() if k.startswith(head)}


#: configs that are cheap in the interpreter (few programs per launch) and still run every fused path's Triton kernels
FAST = {
    "ag_gemm": {"mode": "push_cublas", "push_by": "sm", "gemm_order": "gathered", "comm_sms": 2},
    "gemm_rs": {"mode": "pull_cublas", "reduce_sms": 4},
    # cuBLAS's partial, then one launch that exchanges it: one-shot pushed for the sum, two-shot pulled (row owners,
    # each row's 1/rms handed out) for the residual + RMSNorm epilogue
    "gemm_ar": {"mode": "one_shot", "gemm": "cublas", "transport": "push", "tiles_per_flag": 1, "comm_sms": 4},
    "gemm_ar_rmsnorm": {"mode": "two_shot", "gemm": "cublas", "transport": "pull", "tiles_per_flag": 1, "comm_sms": 4},
}


def fast_store(path: Path, world_sizes: tuple[int, ...] = (2, 4), configs: dict[str, dict] | None = None) -> str:
    """A SQLite store holding one record of each fused GEMM family per world size, with a FAST config (or `configs`'
    for the kernels it names): every layer shape finds it as its nearest tuned shape (`on_miss="nearest"`, the layers'
    default). Returns its URL."""
    from jointtune.autotune.tuner.keys import triton_version
    from jointtune.db import NewRecord, open_store
    from jointtune.hardware import detect
    from jointtune.kernels import get_family
    from jointtune.search_spaces import get_space

    url = f"sqlite:///{path}"
    store = open_store(url)
    for kernel, config in {**FAST, **(configs or {})}.items():
        for w in world_sizes:
            store.upsert_record(NewRecord(
                kernel=kernel, kernel_version=get_family(kernel).version,
                space_version=get_space(get_family(kernel).space).version,
                shape={"M": 64, "N": 256, "K": 256}, dtype="bfloat16", world_size=w, hardware_id=detect().hardware_id,
                triton_version=triton_version(), config=dict(config), latency_p50_us=100.0, trials=1, timing="eager",
            ))  # fmt: skip
    return url
