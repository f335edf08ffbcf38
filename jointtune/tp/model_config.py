"""A model's dims from its Hugging Face `config.json`, and what the tensor-parallel layer can run of it.

The layer is the Llama architecture: RMSNorm, one QKV projection, rotary embeddings (RoPE, no scaling),
grouped-query attention over the whole sequence, o_proj, a SwiGLU MLP, residuals. Configs that need more
are refused by name, never run approximately: attention bias on o_proj (`attention_bias`), MLP bias, RoPE
scaling, a sliding window, mixture-of-experts MLPs (the attention of a MoE model is still a valid subject
of `tune --model`, see `shapes`), activations other than SiLU. Qwen2's bias on q, k and v (its architecture
always has it) is run: it is added to the column-parallel output.

Shipped configs (transcribed from the models' published config.json; nothing is downloaded):
`llama-3-8b`, `llama-3-70b`, `qwen2.5-32b`, `mixtral-8x7b` (attention only: its MLP is MoE).

Example:
    >>> cfg = load_model_config("llama-3-70b")
    >>> cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    (8192, 64, 8, 128)
    >>> cfg.heads_per_rank(4), cfg.kv_heads_per_rank(4), cfg.intermediate_per_rank(4)
    (16, 2, 7168)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jointtune.errors import JointtuneError

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
#: model types whose decoder layer is exactly this layer (qwen2 with its q/k/v bias); mixtral: attention only
DENSE_TYPES = ("llama", "mistral", "qwen2")
ATTENTION_ONLY_TYPES = ("mixtral",)
_QKV_BIAS_TYPES = ("qwen2",)


class ModelConfigError(JointtuneError, ValueError):
    """A model config that can't be read, or that asks for something the layer can't run (names the field)."""


def shipped_configs() -> list[str]:
    """Names `load_model_config` takes besides a path."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


@dataclass(frozen=True)
class ModelConfig:
    """The dims one decoder layer needs, read from an HF-style config (see `load_model_config`)."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    rope_theta: float
    rms_norm_eps: float
    initializer_range: float
    qkv_bias: bool
    #: why the MLP can't run (a MoE model), else None
    moe: str | None = None
    #: why nothing of the layer can run (bias, scaling, sliding window, ...), else None
    unsupported: str | None = None

    def check_runnable(self, *, attention_only: bool = False) -> None:
        """ModelConfigError naming the field unless the layer (or, with `attention_only`, its attention) runs this
        model."""
        if self.unsupported is not None:
            raise ModelConfigError(f"{self.name}: {self.unsupported}")
        if self.moe is not None and not attention_only:
            raise ModelConfigError(f"{self.name}: {self.moe}")

    def heads_per_rank(self, tp: int) -> int:
        self._check_tp(tp)
        return self.num_attention_heads // tp

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads a rank holds: H_KV / TP, or 1 where TP is a multiple of H_KV (each KV head is then held by
        TP / H_KV ranks, the ones whose query heads read it)."""
        self._check_tp(tp)
        return max(1, self.num_key_value_heads // tp)

    def kv_head_of_rank(self, tp: int, rank: int) -> int:
        """The first KV head rank `rank` holds (the one its first query head reads)."""
        self._check_tp(tp)
        return rank * self.num_key_value_heads // tp

    def intermediate_per_rank(self, tp: int) -> int:
        self._check_tp(tp)
        return self.intermediate_size // tp

    def qkv_per_rank(self, tp: int) -> int:
        """Columns of the fused QKV projection on one rank: (H/TP + 2 * KV heads per rank) * head_dim."""
        return (self.heads_per_rank(tp) + 2 * self.kv_heads_per_rank(tp)) * self.head_dim

    def _check_tp(self, tp: int) -> None:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ModelConfigError(f"tp: {tp!r} is not allowed; give an integer >= 1")
        H, H_KV = self.num_attention_heads, self.num_key_value_heads
        if H % tp:
            raise ModelConfigError(
                f"{self.name}: tp={tp} is not allowed; num_attention_heads={H} must be divisible by it"
            )
        if H_KV % tp and tp % H_KV:
            raise ModelConfigError(
                f"{self.name}: tp={tp} is not allowed; num_key_value_heads={H_KV} must divide it or be divisible by it"
            )
        if self.moe is None and self.intermediate_size % tp:
            raise ModelConfigError(
                f"{self.name}: tp={tp} is not allowed; intermediate_size={self.intermediate_size} must be divisible "
                "by it"
            )

    def check_tp(self, tp: int) -> None:
        """ModelConfigError naming the dim unless heads, KV heads and the MLP split over `tp` ranks."""
        self._check_tp(tp)


def _positive_int(data: Mapping[str, Any], name: str, source: str, default: int | None = None) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{source}: {name}: {value!r} is not allowed; it must be an integer >= 1")
    return value


def _positive_float(data: Mapping[str, Any], name: str, source: str, default: float) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ModelConfigError(f"{source}: {name}: {value!r} is not allowed; it must be a finite number > 0")
    return float(value)


def _unsupported(data: Mapping[str, Any], model_type: str) -> str | None:
    """Why the layer can't run this config at all (the first reason, naming its field), or None."""
    if data.get("attention_bias"):
        return "attention_bias: true is not supported (bias on o_proj; only Qwen2's q/k/v bias is run)"
    if data.get("mlp_bias"):
        return "mlp_bias: true is not supported (the MLP projections have no bias in this layer)"
    if data.get("rope_scaling") not in (None, {}):
        return f"rope_scaling: {data['rope_scaling']!r} is not supported; only plain RoPE (rope_scaling: null) runs"
    window = data.get("sliding_window")
    if window is not None and data.get("use_sliding_window", True):
        return f"sliding_window: {window!r} is not supported; attention here covers the whole sequence"
    act = data.get("hidden_act", "silu")
    if act != "silu":
        return f"hidden_act: {act!r} is not supported; allowed: 'silu' (SwiGLU)"
    if model_type not in (*DENSE_TYPES, *ATTENTION_ONLY_TYPES):
        allowed = ", ".join((*DENSE_TYPES, *ATTENTION_ONLY_TYPES))
        return f"model_type: {model_type!r} is not a Llama-architecture layer this runs; allowed: {allowed}"
    return None


def _moe(data: Mapping[str, Any], model_type: str) -> str | None:
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        if data.get(name):
            return f"{name}: {data[name]!r} is a mixture-of-experts MLP, which is not supported (attention only)"
    if model_type in ATTENTION_ONLY_TYPES:
        return f"model_type: {model_type!r} has a mixture-of-experts MLP, which is not supported (attention only)"
    return None


def model_config_from_dict(data: Mapping[str, Any], *, name: str = "model") -> ModelConfig:
    """A ModelConfig from a parsed config.json; ModelConfigError naming the field for a missing or bad dim."""
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{name}: the config must be a JSON object of field -> value")
    model_type = data.get("model_type", "llama")
    if not isinstance(model_type, str):
        raise ModelConfigError(f"{name}: model_type: {model_type!r} is not allowed; it must be a string")
    hidden = _positive_int(data, "hidden_size", name)
    heads = _positive_int(data, "num_attention_heads", name)
    kv_heads = _positive_int(data, "num_key_value_heads", name, default=heads)
    if heads % kv_heads:
        raise ModelConfigError(
            f"{name}: num_key_value_heads: {kv_heads} is not allowed; num_attention_heads={heads} must be divisible "
            "by it"
        )
    head_dim = data.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ModelConfigError(f"{name}: hidden_size={hidden} is not divisible by num_attention_heads={heads}; "
                                   "give head_dim")  # fmt: skip
        head_dim = hidden // heads
    head_dim = _positive_int({"head_dim": head_dim}, "head_dim", name)
    if head_dim % 2:
        raise ModelConfigError(f"{name}: head_dim: {head_dim} is not allowed; RoPE needs an even head dim")
    return ModelConfig(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_positive_int(data, "intermediate_size", name),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=_positive_int(data, "num_hidden_layers", name, default=1),
        rope_theta=_positive_float(data, "rope_theta", name, 10000.0),
        rms_norm_eps=_positive_float(data, "rms_norm_eps", name, 1e-6),
        initializer_range=_positive_float(data, "initializer_range", name, 0.02),
        qkv_bias=model_type in _QKV_BIAS_TYPES,
        moe=_moe(data, model_type),
        unsupported=_unsupported(data, model_type),
    )


def load_model_config(source: str | Path) -> ModelConfig:
    """A shipped config by name (`shipped_configs()`), or any HF config.json: a file, or a directory holding one."""
    text = str(source)
    path = Path(text)
    if text in shipped_configs():
        path, name = CONFIG_DIR / f"{text}.json", text
    else:
        if path.is_dir():
            path = path / "config.json"
        name = path.parent.name if path.name == "config.json" else path.stem
        if not path.is_file():
            raise ModelConfigError(
                f"model: {text!r} is neither a shipped config ({', '.join(shipped_configs())}) nor a config.json file "
                "(or a directory holding one)"
            )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"model: {str(path)!r} can't be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"model: {str(path)!r} is not JSON ({exc.msg} at line {exc.lineno})") from None
    return model_config_from_dict(data, name=name)
