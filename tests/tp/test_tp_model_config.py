"""Model configs: the shipped ones, any HF config.json path, and what the layer refuses by name."""

from __future__ import annotations

import json

import pytest

from jointtune.tp.model_config import ModelConfigError, load_model_config, model_config_from_dict, shipped_configs

BASE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2}


def test_shipped_configs_read_as_published():
    assert shipped_configs() == ["llama-3-70b", "llama-3-8b", "mixtral-8x7b", "qwen2.5-32b"]
    dims = {name: load_model_config(name) for name in shipped_configs()}
    got = {name: (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                  c.rope_theta, c.qkv_bias) for name, c in dims.items()}  # fmt: skip
    assert got == {
        "llama-3-8b": (4096, 14336, 32, 8, 128, 500000.0, False),
        "llama-3-70b": (8192, 28672, 64, 8, 128, 500000.0, False),
        "qwen2.5-32b": (5120, 27648, 40, 8, 128, 1000000.0, True),  # Qwen2 always has q/k/v bias
        "mixtral-8x7b": (4096, 14336, 32, 8, 128, 1000000.0, False),
    }
    for name in ("llama-3-8b", "llama-3-70b", "qwen2.5-32b"):
        dims[name].check_runnable()  # qwen2.5's sliding_window is off (use_sliding_window: false)
    with pytest.raises(ModelConfigError, match=r"mixtral-8x7b: num_local_experts: 8 is a mixture-of-experts MLP"):
        dims["mixtral-8x7b"].check_runnable()
    dims["mixtral-8x7b"].check_runnable(attention_only=True)


def test_any_hf_config_path_file_or_directory(tmp_path):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps({**BASE, "head_dim": 96}))
    cfg = load_model_config(tmp_path / "my-model")
    assert (cfg.name, cfg.head_dim, cfg.num_key_value_heads) == ("my-model", 96, 2)
    assert load_model_config(str(tmp_path / "my-model" / "config.json")).head_dim == 96
    with pytest.raises(ModelConfigError, match=r"neither a shipped config .* nor a config.json file"):
        load_model_config(tmp_path / "nothing")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ModelConfigError, match=r"bad.json' is not JSON"):
        load_model_config(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"attention_bias": True}, "attention_bias: true is not supported"),
        ({"mlp_bias": True}, "mlp_bias: true is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling: .* is not supported"),
        ({"sliding_window": 4096}, "sliding_window: 4096 is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act: 'gelu' is not supported"),
        ({"model_type": "qwen3"}, "model_type: 'qwen3' is not a Llama-architecture layer"),
        ({"num_local_experts": 8}, "num_local_experts: 8 is a mixture-of-experts MLP"),
    ],
)
def test_what_the_layer_cant_run_is_refused_by_name(changes, message):
    cfg = model_config_from_dict({**BASE, **changes}, name="m")
    with pytest.raises(ModelConfigError, match=f"m: {message}"):
        cfg.check_runnable()


def test_sliding_window_switched_off_runs():
    model_config_from_dict({**BASE, "sliding_window": 4096, "use_sliding_window": False}).check_runnable()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": "4096"}, "hidden_size: '4096' is not allowed; it must be an integer >= 1"),
        ({"num_key_value_heads": 3}, "num_key_value_heads: 3 is not allowed; num_attention_heads=2 must be"),
        ({"rope_theta": -1}, "rope_theta: -1 is not allowed; it must be a finite number > 0"),
        ({"hidden_size": 129}, "hidden_size=129 is not divisible by num_attention_heads=2; give head_dim"),
        ({"head_dim": 63}, "head_dim: 63 is not allowed; RoPE needs an even head dim"),
    ],
)
def test_bad_dims_name_the_field(changes, message):
    with pytest.raises(ModelConfigError, match=message):
        model_config_from_dict({**BASE, **changes})


def test_tp_degrees_the_dims_allow():
    cfg = load_model_config("llama-3-70b")
    assert [cfg.kv_heads_per_rank(t) for t in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert [cfg.kv_head_of_rank(16, r) for r in (0, 1, 2, 15)] == [0, 0, 1, 7]  # two ranks per KV head
    with pytest.raises(ModelConfigError, match="tp=3 is not allowed; num_attention_heads=64 must be divisible"):
        cfg.check_tp(3)
    qwen = load_model_config("qwen2.5-32b")
    with pytest.raises(ModelConfigError, match="tp=16 is not allowed; num_attention_heads=40"):
        qwen.check_tp(16)
    odd = model_config_from_dict({**BASE, "num_attention_heads": 12, "num_key_value_heads": 3, "hidden_size": 768,
                                  "intermediate_size": 768})  # fmt: skip
    with pytest.raises(ModelConfigError, match="num_key_value_heads=3 must divide it or be divisible by it"):
        odd.check_tp(2)
