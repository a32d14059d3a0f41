"""Model presets -> Hugging Face configs; exact parameter counts and training FLOPs per token.

Models are `transformers` causal LMs built from a config and randomly initialised; hanlm has no
transformer of its own. A model is named either by a preset (a `LlamaConfig`: RMSNorm, RoPE,
SwiGLU, grouped-query attention) or by the path of any transformers causal LM's `config.json`.

Presets, with their exact parameter counts (tied embeddings; `parameter_count` computes them):

| preset | layers | hidden | heads / kv | ffn  | params at vocab 4,096 | at vocab 65,536 |
|--------|--------|--------|------------|------|-----------------------|-----------------|
| tiny   | 2      | 64     | 4 / 2      | 192  | 360,768               | 4,292,928       |
| demo   | 4      | 256    | 4 / 2      | 768  | 4,196,608             | 19,925,248      |
| 125m   | 12     | 768    | 12 / 4     | 2048 | 78,662,400            | 125,848,320     |
| 350m   | 24     | 1024   | 16 / 8     | 2816 | 287,360,000           | 350,274,560     |
| 1.3b   | 24     | 2048   | 16 / 8     | 6144 | 1,216,448,512         | 1,342,277,632   |

`1.3b` is the field report's model: 1.34B parameters with its 65,536-token vocabulary.

The vocabulary size always comes from the run's tokenizer, overriding a config file's, and the
context length is at least the run's `seq_len`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)
from transformers.utils import logging as hf_logging

from hanlm import model_folder, remote_code
from hanlm.errors import UserError
from hanlm.model_presets import PRESETS, preset_names

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


# --- configs ------------------------------------------------------------------------------------


def model_config(spec: str, *, vocab_size: int, seq_len: int) -> PretrainedConfig:
    """The config of preset `spec`, or of the `config.json` at path `spec` (a file or its folder).

    vocab_size is the run's tokenizer's and replaces a file's; the context length
    (max_position_embeddings) is `seq_len` for a preset and at least `seq_len` for a file.
    A file's own code (`auto_map`) runs only under `model.trust_remote_code` (hanlm.remote_code);
    otherwise its model_type must be one that the installed transformers knows.
    """
    if spec in PRESETS:
        return LlamaConfig(**PRESETS[spec], vocab_size=vocab_size, max_position_embeddings=seq_len)
    if not _looks_like_path(spec):
        raise UserError(
            f"unknown model preset {spec!r}",
            fix=f"use one of {', '.join(preset_names())}, or the path of a config.json",
        )
    config = _config_from_file(_config_file(Path(spec)))
    text_config = config.get_text_config()
    text_config.vocab_size = vocab_size
    file_context = getattr(text_config, "max_position_embeddings", None)
    if file_context is not None:
        text_config.max_position_embeddings = max(seq_len, file_context)
    return config


def run_model_config(model_section, *, vocab_size: int, seq_len: int) -> PretrainedConfig:
    """The run's model ([model]): its preset's (or config.json's) for the run's tokenizer, or,
    for continued pretraining (`model.init_from`), the model's own config with its vocabulary
    grown to hold the run's tokenizer where that has more tokens (never shrunk: a model's
    padded spare rows stay)."""
    if not model_section.init_from:
        return model_config(model_section.preset, vocab_size=vocab_size, seq_len=seq_len)
    base = model_folder.check_model_folder(model_section.init_from)
    own = model_folder.vocab_rows(base)
    return model_config(str(base), vocab_size=max(own, vocab_size), seq_len=seq_len)


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or "\\" in spec or spec.endswith(".json") or Path(spec).exists()


def _config_file(path: Path) -> Path:
    file = path / model_folder.CONFIG if path.is_dir() else path
    if not file.is_file():
        raise UserError(
            f"model config file {file} does not exist",
            fix=f"give a preset ({', '.join(preset_names())}) or the path of a model's config.json",
        )
    return file


def _config_from_file(file: Path) -> PretrainedConfig:
    data = _read_json_object(file)
    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise UserError(
            "model config has no model_type",
            where=str(file),
            fix='add the model_type (e.g. "llama") or save the config with save_pretrained',
        )
    if model_type not in CONFIG_MAPPING and _has_own_code(data) and remote_code.allowed():
        return _config_with_own_code(file)
    if model_type not in CONFIG_MAPPING:
        if _has_own_code(data):
            raise UserError(
                f"model config has model_type {model_type!r}, whose code is the model's own "
                "(auto_map): hanlm runs a model's code only when the recipe trusts it",
                where=str(file),
                fix="read the model's code first; then set model.trust_remote_code = true "
                "(--trust-remote-code), or use a model of an architecture transformers ships",
            )
        raise UserError(
            f"model config has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know",
            where=str(file),
            fix="give the config of a model built into transformers (llama, mistral, qwen2, ...)",
        )
    if not _is_decoder_only_lm(data):
        raise UserError(
            f"model_type {model_type!r} is not a decoder-only causal language model",
            where=str(file),
            fix="give the config of a causal LM such as llama, mistral or qwen2",
        )
    try:
        return CONFIG_MAPPING[model_type].from_dict(data)
    # a bad value raises TypeError, ValueError or (transformers 5) huggingface_hub's
    # StrictDataclassError: no common base but Exception, and nothing else runs here
    except Exception as e:
        raise UserError(f"transformers rejects the model config: {e}", where=str(file)) from e


def _has_own_code(data: dict[str, Any]) -> bool:
    auto_map = data.get("auto_map")
    return isinstance(auto_map, dict) and "AutoModelForCausalLM" in auto_map


def _config_with_own_code(file: Path) -> PretrainedConfig:
    """The config of a model whose code is its own (trusted by the recipe), built by that code."""
    from transformers import AutoConfig  # deferred: only for a model with its own code

    try:
        return AutoConfig.from_pretrained(
            file.parent, trust_remote_code=True, local_files_only=True
        )
    except Exception as e:  # the model's own code may raise anything
        raise UserError(
            f"the model's own config code failed: {type(e).__name__}: {e}", where=str(file)
        ) from e


def _read_json_object(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(
            f"model config is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}",
            where=str(file),
            fix="repair the file or save the config again with save_pretrained",
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read model config: {e}", where=str(file)) from e
    if not isinstance(data, dict):
        raise UserError("model config is not a JSON object", where=str(file))
    return data


def _is_decoder_only_lm(data: dict[str, Any]) -> bool:
    # BERT and its kin are in the causal-LM mapping too (as decoders of encoder-decoder models),
    # but they are encoders: a model type that also has a masked-LM head is not one to pretrain.
    model_type = data["model_type"]
    return (
        model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not data.get("is_encoder_decoder", False)
    )


# --- models -------------------------------------------------------------------------------------


def build_model(
    config: PretrainedConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """A randomly initialised causal LM in train() mode, its parameters of `dtype` on `device`.

    The same seed gives the same weights on the same kind of device; the caller's RNG state is
    left as it was. On device "meta" nothing is allocated or initialised: FSDP shards such a
    model first and initialises the shards.
    """
    device = torch.device(device)
    with _seeded_rng(seed, device), device:
        model = AutoModelForCausalLM.from_config(
            config,
            **_attention_keywords(config),
            **{_dtype_keyword(): dtype},
            trust_remote_code=remote_code.allowed(),
        )
    return model.train()


# Selective recomputation keeps what is expensive to recompute (matmul and attention outputs)
# and recomputes the cheap element-wise work between them (norms, rotary, SiLU, products).
_SAVED_IN_SELECTIVE = (
    "aten.mm.default",
    "aten.addmm.default",
    "aten.bmm.default",
    "aten._scaled_mm.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
)


def _selective_policy(ctx, op, *args, **kwargs):
    if str(op) in _SAVED_IN_SELECTIVE:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def enable_activation_checkpointing(model: torch.nn.Module, mode: str) -> None:
    """Recompute each decoder layer's activations in backward: `full` keeps only the layer's
    input, `selective` also keeps its matmul and attention outputs."""
    kwargs: dict = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _selective_policy
        )
    elif mode != "full":
        raise ValueError(f"activation checkpointing mode must be full or selective, not {mode!r}")
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 name
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _attention_keywords(config: PretrainedConfig) -> dict[str, str]:
    # transformers refuses "sdpa" for a model without it (Mamba has no attention at all)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return {}  # a model with its own code (model.trust_remote_code): its own default
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    return {"attn_implementation": "sdpa"} if getattr(model_class, "_supports_sdpa", False) else {}


@contextmanager
def _seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed the CPU generator and `device`'s own; both are restored afterwards.

    Not torch.manual_seed: it reseeds every CUDA device of the host, and fork_rng restores
    only the devices it is given.
    """
    cuda = []
    if device.type == "cuda":
        cuda = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


def _dtype_keyword() -> str:
    # transformers 5 renamed from_config's `torch_dtype` to `dtype`
    return "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def describe(config: PretrainedConfig) -> str:
    """One line for logs, e.g. `llama: 24 layers, hidden 2048, 16/8 heads/kv, ... 1.34B params`."""
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    tied = "tied" if _is_tied(config) else "untied"
    total = parameter_count(config)["total"]
    return (
        f"{config.model_type}: {text.num_hidden_layers} layers, hidden {text.hidden_size}, "
        f"{heads}/{kv_heads} heads/kv, vocab {text.vocab_size:,} ({tied}), "
        f"{_short_count(total)} params"
    )


def _short_count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


# --- parameter counts ---------------------------------------------------------------------------

# Which optional tensors each Llama-like family has: (q/k/v bias, o bias, MLP bias, q/k norm).
_LLAMA_FAMILY = {
    "llama": lambda c: (c.attention_bias, c.attention_bias, c.mlp_bias, False),
    "mistral": lambda c: (False, False, False, False),
    "qwen2": lambda c: (True, False, False, False),
    "qwen3": lambda c: (c.attention_bias, c.attention_bias, False, True),
}


def parameter_count(config: PretrainedConfig) -> dict[str, int]:
    """Exact parameter counts of the model `build_model(config)` builds, shared weights once.

    `embedding` is the input token embedding; `lm_head` the output projection, 0 when it is
    the embedding (tied); `non_embedding` everything else (the layers and the final norm);
    `total` their sum; `per_layer` one decoder layer's. Llama-family configs (llama, mistral,
    qwen2, qwen3) are counted from their shapes; other model types are built on the meta device
    (no memory used) and counted, `per_layer` then being the first layer's.
    """
    if config.model_type not in _LLAMA_FAMILY:
        return _count_built_on_meta(config)
    embedding = config.vocab_size * config.hidden_size
    lm_head = 0 if _is_tied(config) else embedding
    per_layer = _llama_layer_matmul_weights(config) + _llama_layer_small_params(config)
    non_embedding = config.num_hidden_layers * per_layer + config.hidden_size  # + final norm
    return {
        "total": embedding + non_embedding + lm_head,
        "embedding": embedding,
        "non_embedding": non_embedding,
        "lm_head": lm_head,
        "per_layer": per_layer,
    }


def _head_dim(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _query_width(config: PretrainedConfig) -> int:
    """All query heads' width; 0 for a model without attention (a state-space model)."""
    heads = getattr(config, "num_attention_heads", None)
    return heads * _head_dim(config) if heads else 0


def _kv_width(config: PretrainedConfig) -> int:
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return kv_heads * _head_dim(config)


def _llama_layer_matmul_weights(config: PretrainedConfig) -> int:
    hidden, q_width, kv_width = config.hidden_size, _query_width(config), _kv_width(config)
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden  # q, k, v, o
    mlp = 3 * hidden * config.intermediate_size  # gate, up, down
    return attention + mlp


def _llama_layer_small_params(config: PretrainedConfig) -> int:
    """Biases and norm weights of one layer: they are not matmul weights."""
    qkv_bias, o_bias, mlp_bias, qk_norm = _LLAMA_FAMILY[config.model_type](config)
    hidden, q_width, kv_width = config.hidden_size, _query_width(config), _kv_width(config)
    count = 2 * hidden  # the RMSNorms before attention and before the MLP
    count += (q_width + 2 * kv_width) if qkv_bias else 0
    count += hidden if o_bias else 0
    count += (2 * config.intermediate_size + hidden) if mlp_bias else 0
    count += 2 * _head_dim(config) if qk_norm else 0  # per-head RMSNorms of q and k
    return count


def _is_tied(config: PretrainedConfig) -> bool:
    return bool(getattr(config, "tie_word_embeddings", False))


def _count_built_on_meta(config: PretrainedConfig) -> dict[str, int]:
    model = build_model(config, device="meta")
    total = sum(p.numel() for p in model.parameters())
    embedding_weight = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    lm_head = 0
    if output is not None and output.weight is not embedding_weight:
        lm_head = output.weight.numel()
    return {
        "total": total,
        "embedding": embedding_weight.numel(),
        "non_embedding": total - embedding_weight.numel() - lm_head,
        "lm_head": lm_head,
        "per_layer": _first_layer_count(model, config.get_text_config().num_hidden_layers),
    }


def _first_layer_count(model: torch.nn.Module, n_layers: int) -> int:
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return sum(p.numel() for p in module[0].parameters())
    return 0


# --- FLOPs --------------------------------------------------------------------------------------


def flops_per_token(config: PretrainedConfig, seq_len: int) -> dict[str, int]:
    """Training FLOPs (forward and backward) per token of sequences of `seq_len` tokens.

    A matmul costs 2 FLOPs per weight per token forward and twice that backward (the input's
    gradient and the weight's), hence 6 per weight:

    - `dense`: 6 x every matmul weight a token passes through: the layers' projections and the
      output projection (even when tied to the embedding). The embedding lookup, norms, biases,
      activations and the loss are not matmuls and are left out (a small fraction).
    - `attention`: the score (Q K^T) and value (P V) matmuls, 2 x 2 x seq_len x head_dim per
      query head and layer forward, so 12 x layers x heads x head_dim x seq_len for training.
      As in PaLM's MFU formula (6N + 12·L·H·Q·T), the causal mask is not discounted: it counts
      the full seq_len x seq_len scores, which is also what the math SDPA kernel computes.
    - `total`: dense + attention.
    - `six_n`: 6 x all parameters, the 6·N·D rule of thumb of the field report.

    Exact for Llama-family configs (FlopCounterMode agrees to the FLOP, see the tests); for other
    model types `dense` treats every parameter but the embedding as a matmul weight.
    """
    counts = parameter_count(config)
    text = config.get_text_config()
    output_projection = text.vocab_size * text.hidden_size
    if config.model_type in _LLAMA_FAMILY:
        matmul_weights = text.num_hidden_layers * _llama_layer_matmul_weights(text)
    else:
        matmul_weights = counts["non_embedding"]
    dense = 6 * (matmul_weights + output_projection)
    attention = 12 * text.num_hidden_layers * _query_width(text) * seq_len
    return {
        "dense": dense,
        "attention": attention,
        "total": dense + attention,
        "six_n": 6 * counts["total"],
    }


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers draws a tqdm bar for every save and load; hanlm prints its own summary."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
