"""LoRA fine-tuning through PEFT, the way budget users fine-tune a 1B model on one GPU.

Adapters go on the named linear layers of every block (PEFT's LoraConfig); everything else is
frozen. The chat template tokens' embedding rows can be trained alone (PEFT's
trainable_token_indices: a delta of those rows only, shared with the tied output head), which
is what the field's model lacked: with them frozen and never trained, its answers never ended.

Training uses the causal LM with the adapters injected in place (PEFT's `get_base_model()`), so
hanlm's loss, parallelism and checkpoints see a transformers model as in full fine-tuning; its
checkpoints hold the frozen weights beside the adapters, and `merged` rebuilds the same model
from one and folds the adapters into a plain transformers model (what export writes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from hanlm.config import SftLoraSection
from hanlm.errors import UserError
from hanlm.model_folder import ADAPTER_FOLDER

__all__ = [
    "ADAPTER_FOLDER",
    "Adapters",
    "check_targets",
    "hold_frozen_linears",
    "trainable_counts",
]


def target_problem(model: torch.nn.Module, targets: list[str]) -> str | None:
    """Why `targets` cannot be LoRA's target modules in `model`, or None: each must name (by the
    last part of its path, as PEFT matches) at least one linear layer, and only linear layers."""
    by_name: dict[str, set[str]] = {}
    for path, module in model.named_modules():
        by_name.setdefault(path.rsplit(".", 1)[-1], set()).add(type(module).__name__)
    linear = sorted(
        name for name, kinds in by_name.items() if "Linear" in kinds and name not in ("lm_head", "")
    )
    for target in targets:
        kinds = by_name.get(target)
        if kinds is None:
            return f"sft.lora.target_modules names {target!r}, which the model has no layer of; its linear layers: {', '.join(linear)}"
        if kinds != {"Linear"}:
            return f"sft.lora.target_modules names {target!r}, a {'/'.join(sorted(kinds))} layer; LoRA here adapts linear layers: {', '.join(linear)}"
        if target == "lm_head":
            return "sft.lora.target_modules names lm_head, which is tied to the embedding; train the chat tokens' rows with sft.train_new_token_rows instead"
    return None


def check_targets(model: torch.nn.Module, section: SftLoraSection) -> None:
    problem = target_problem(model, section.target_modules)
    if problem:
        raise UserError(
            problem, fix="set sft.lora.target_modules to names of the model's linear layers"
        )


@dataclass(frozen=True)
class Adapters:
    """What LoRA adds to a model: PEFT's LoraConfig from sft.lora, and the embedding rows
    trained besides (`token_rows`; empty: none)."""

    section: SftLoraSection
    token_rows: tuple[int, ...] = ()

    def config(self):
        from peft import LoraConfig  # deferred: only LoRA SFT needs PEFT

        return LoraConfig(
            r=self.section.rank,
            lora_alpha=self.section.alpha,
            lora_dropout=self.section.dropout,
            target_modules=list(self.section.target_modules),
            bias="none",
            trainable_token_indices=sorted(self.token_rows) or None,
            task_type="CAUSAL_LM",
        )

    def inject(self, model: torch.nn.Module, seed: int = 0):
        """(the PEFT model wrapping `model`, `model` itself with the adapters injected in place
        and only they trainable). PEFT draws the A matrices from torch's global generator:
        drawn here from `seed` alone, they are the same on every rank and in every rerun."""
        from peft import get_peft_model  # deferred: as LoraConfig above

        check_targets(model, self.section)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # PEFT asks the model transformers' deprecated `is_gradient_checkpointing`
            # (peft_model.py): transformers' FutureWarning about PEFT's call, not hanlm's, on
            # every LoRA run; hanlm cannot call it otherwise
            warnings.filterwarnings(
                "ignore",
                message="`is_gradient_checkpointing` is deprecated",
                category=FutureWarning,
            )
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, self.config())
        return peft_model, peft_model.get_base_model()

    @staticmethod
    def merged(peft_model) -> torch.nn.Module:
        """The plain transformers model with the adapters (and the trained rows) folded in."""
        return peft_model.merge_and_unload()

    @staticmethod
    def save(peft_model, folder: Path) -> None:
        """The adapter alone, as PEFT saves it (adapter_config.json, adapter_model.safetensors):
        `PeftModel.from_pretrained(source_model, folder)` puts it back on the source model."""
        peft_model.save_pretrained(str(folder), safe_serialization=True)


def hold_frozen_linears(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Store the frozen linear layers of the blocks in `dtype`, the compute dtype; returns the
    elements stored so. Under autocast (and FSDP2's param_dtype) every matmul reads those weights
    in that dtype anyway, rounded the same way, so training computes exactly as before, without
    their float32 copies and autocast's cached casts of them (for a 1.3B model, ~5 GiB). The
    output head stays float32 (tied to the embedding, whose chat rows PEFT may train), and so do
    the adapters and the norms. At float32 there is nothing to do."""
    stored = 0
    if dtype == torch.float32:
        return stored
    for path, module in model.named_modules():
        if type(module) is not torch.nn.Linear or path.split(".", 1)[0] == "lm_head":
            continue
        if any(p.requires_grad for p in module.parameters()):
            continue
        module.to(dtype)
        stored += sum(p.numel() for p in module.parameters())
    return stored


def trainable_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of `model`, each tensor counted once."""
    seen: dict[int, torch.nn.Parameter] = {}
    for parameter in model.parameters():
        seen.setdefault(id(parameter), parameter)
    total = sum(p.numel() for p in seen.values())
    trained = sum(p.numel() for p in seen.values() if p.requires_grad)
    return trained, total
