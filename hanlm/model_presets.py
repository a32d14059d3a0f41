"""The model presets: Llama shapes by name, as plain data (no torch or transformers), so what
only needs their names or sizes (a flag's check, the planner's table) stays light."""

from __future__ import annotations

from typing import Any

# Shared by every preset: Llama defaults, tied input/output embeddings (a large vocabulary is a
# big share of a small model's parameters), no biases.
_LLAMA_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    # for tests: well under 1M parameters with a small vocabulary
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 192,
        "rope_theta": 10_000.0,
        **_LLAMA_COMMON,
    },
    # learns the few-MB demo corpus in minutes on a 2-core CPU
    "demo": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 768,
        "rope_theta": 10_000.0,
        **_LLAMA_COMMON,
    },
    "125m": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
        "rope_theta": 500_000.0,
        **_LLAMA_COMMON,
    },
    "350m": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 2816,
        "rope_theta": 500_000.0,
        **_LLAMA_COMMON,
    },
    # the field report's 1.35B model (1,342,277,632 parameters at vocab 65,536)
    "1.3b": {
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 6144,
        "rope_theta": 500_000.0,
        **_LLAMA_COMMON,
    },
}


def preset_names() -> list[str]:
    return list(PRESETS)
