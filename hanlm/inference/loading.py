"""Loading a Hugging Face causal LM folder, safely, onto a device.

Every model hanlm loads (generate, chat, eval, doctor, SFT's closure check, a distillation
teacher) comes through `load_folder`: the folder is checked first (hanlm.model_folder: config,
safetensors weights, tokenizer files), transformers loads it without running the model's own code
(unless the recipe sets `model.trust_remote_code`: hanlm.remote_code) and
`use_safetensors=True` from the local folder only (`local_files_only`: nothing is downloaded), and a failure is one UserError.
`load_tokenizer` (a tokenizer folder alone) and `read_config` (a model folder's config, no
weights loaded) follow the same rules.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hanlm import remote_code
from hanlm.chat_template import END_OF_TURN
from hanlm.errors import UserError
from hanlm.inference.devices import resolve_device, resolve_dtype
from hanlm.model import no_progress_bars
from hanlm.model_folder import TOKENIZER_FIX, check_model_folder, check_tokenizer_folder

TOKENIZER_FAILURE = "cannot load a tokenizer from {path}"
MODEL_FAILURE = "cannot load a causal language model from {path}"
MODEL_FIX = "give a folder holding a decoder-only model's config.json and weights"


def remote_code_refusal(path, error: Exception) -> UserError | None:
    """The refusal of a folder that needs its own Python code to load (an `auto_map` in its
    config or tokenizer config), or None for another failure: hanlm runs a model's code only
    when the recipe trusts it (model.trust_remote_code)."""
    if "trust_remote_code" not in str(error) or remote_code.allowed():
        return None
    return UserError(
        f"{path} needs its own Python code to load (remote code, named by `auto_map` in its "
        "config): hanlm runs a model's own code only when the recipe trusts it",
        where=str(path),
        fix="use a model of an architecture transformers knows (Llama, Qwen2/3, Gemma, "
        "EXAONE 4, ...); or read its code and set model.trust_remote_code = true "
        "(--trust-remote-code)",
    )


@dataclass
class LoadedModel:
    """A model in eval mode and its tokenizer (None when the caller asked for none)."""

    model: Any
    tokenizer: Any
    path: Path

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def end_token_ids(self) -> list[int]:
        """Tokens that end an answer: the model's eos ids, the tokenizer's eos and <|eot|>."""
        ids: list[int] = []
        eos = self.model.generation_config.eos_token_id
        ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        eot = self.tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if isinstance(eot, int) and eot != self.tokenizer.unk_token_id:
            ids.append(eot)
        return sorted(set(ids))

    def pad_token_id(self) -> int:
        if self.tokenizer.pad_token_id is not None:
            return self.tokenizer.pad_token_id
        return self.end_token_ids()[0]


def load_folder(
    path: str | Path,
    *,
    tokenizer: bool = True,
    device: str | torch.device = "cpu",
    setting: str = "device",
    dtype: str = "auto",
    quiet: bool = False,
    failure: str | None = None,
    fix: str | None = None,
) -> LoadedModel:
    """The checked folder's model (in eval mode, on `device`, in `dtype`) and, with `tokenizer`,
    its tokenizer. The device is resolved after the folder is checked (hanlm.inference.devices;
    `setting` names it in errors). `quiet` hides transformers' loading bar. A load that fails
    is a UserError "`failure`: reason" (`failure` may name {path}) with `fix`; by default they
    say whether the tokenizer or the model failed."""
    torch_dtype = resolve_dtype(dtype)
    path = check_model_folder(path, tokenizer=tokenizer)
    torch_device = resolve_device(device, setting=setting)

    def refuse(default_failure: str, default_fix: str, error: Exception) -> UserError:
        what = (failure or default_failure).format(path=path)
        return remote_code_refusal(path, error) or UserError(
            f"{what}: {error}", fix=fix or default_fix
        )

    loaded_tokenizer = None
    if tokenizer:
        try:
            loaded_tokenizer = AutoTokenizer.from_pretrained(
                path, trust_remote_code=remote_code.allowed(), local_files_only=True
            )
        except (OSError, ValueError, KeyError) as e:
            raise refuse(TOKENIZER_FAILURE, TOKENIZER_FIX, e) from None
    keywords: dict[str, Any] = {} if torch_dtype is None else {"dtype": torch_dtype}
    try:
        with no_progress_bars() if quiet else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(
                path,
                trust_remote_code=remote_code.allowed(),
                use_safetensors=True,
                local_files_only=True,
                **keywords,
            )
    except (OSError, ValueError, KeyError) as e:
        raise refuse(MODEL_FAILURE, MODEL_FIX, e) from None
    return LoadedModel(model.to(torch_device).eval(), loaded_tokenizer, path)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer in the checked folder `path` (hanlm.model_folder), loaded from its local
    files only and without remote code; a failure is a UserError."""
    path = check_tokenizer_folder(path)
    try:
        return AutoTokenizer.from_pretrained(
            path, trust_remote_code=remote_code.allowed(), local_files_only=True
        )
    except (OSError, ValueError, KeyError) as e:
        raise remote_code_refusal(path, e) or UserError(
            f"{TOKENIZER_FAILURE.format(path=path)}: {e}", fix=TOKENIZER_FIX
        ) from None


def read_config(path: str | Path, *, failure: str | None = None, fix: str | None = None) -> Any:
    """The transformers config of the checked model folder `path` (no weights are loaded),
    from its local files only and without remote code. A failure is a UserError "`failure`:
    reason" (`failure` may name {path}) with `fix`."""
    path = check_model_folder(path, tokenizer=False)
    try:
        return AutoConfig.from_pretrained(
            path, trust_remote_code=remote_code.allowed(), local_files_only=True
        )
    except (OSError, ValueError, KeyError) as e:
        what = (failure or "cannot read the model config in {path}").format(path=path)
        raise remote_code_refusal(path, e) or UserError(
            f"{what}: {e}", fix=fix or MODEL_FIX
        ) from None


def load(
    model_dir: str | Path, device: str = "auto", *, setting: str = "generate.device"
) -> LoadedModel:
    """A model folder ready for generation: its tokenizer pads on the left (batches end where
    generation continues) and has a padding token."""
    loaded = load_folder(model_dir, device=device, setting=setting)
    loaded.tokenizer.padding_side = "left"
    if loaded.tokenizer.pad_token is None and loaded.tokenizer.eos_token is not None:
        loaded.tokenizer.pad_token = loaded.tokenizer.eos_token  # masked out: any token will do
    return loaded


def context_length(model) -> int | None:
    """The most positions the model was built for (None when its config does not say)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config or model.config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
