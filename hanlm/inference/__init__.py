"""Running a Hugging Face causal LM: one way to load it, place it and generate with it.

- `devices`: `resolve_device` (auto, cpu, cuda, cuda:N; the one rule of every command) and
  `resolve_dtype` (auto, fp32, bf16).
- `loading`: `load_folder` loads any model folder safely (checked by hanlm.model_folder,
  safetensors only, no remote code, nothing downloaded); `load` readies one for generation;
  `load_tokenizer` and `read_config` load a tokenizer folder or a model's config the same way.
- `processors`: hanlm's logits processors (repetition control that spares special tokens,
  frequency and presence penalties) in one fixed order.
- `generation`: `generate_ids`, the batched loop every caller shares, and `generate` / `stream`
  with hanlm's decoding settings.

Layer 2: imports only errors, console, config, model_folder and chat_template below it; generate,
chat, evals and train use it.
"""

from hanlm.inference.devices import DTYPES, resolve_device, resolve_dtype
from hanlm.inference.generation import (
    StopFlag,
    chat_prompt,
    decoding_kwargs,
    encode,
    generate,
    generate_ids,
    left_padded,
    prompt_budget,
    prompt_ids,
    seed_everything,
    stream,
)
from hanlm.inference.loading import (
    LoadedModel,
    context_length,
    load,
    load_folder,
    load_tokenizer,
    read_config,
)
from hanlm.inference.processors import (
    FrequencyPresencePenalty,
    SparingRepetitionPenalty,
    exempt_token_ids,
    logits_processors,
)

__all__ = [
    "DTYPES",
    "FrequencyPresencePenalty",
    "LoadedModel",
    "SparingRepetitionPenalty",
    "StopFlag",
    "chat_prompt",
    "context_length",
    "decoding_kwargs",
    "encode",
    "exempt_token_ids",
    "generate",
    "generate_ids",
    "left_padded",
    "load",
    "load_folder",
    "load_tokenizer",
    "logits_processors",
    "prompt_budget",
    "prompt_ids",
    "read_config",
    "resolve_device",
    "resolve_dtype",
    "seed_everything",
    "stream",
]
