"""`hanlm export`: a training checkpoint -> a plain Hugging Face folder.

The folder holds what transformers, vLLM and lm-evaluation-harness read, and nothing that needs
hanlm or pickle to load (llama.cpp reads the GGUF file `hanlm/share/gguf.py` writes from it):

    model.safetensors  config.json  generation_config.json
    tokenizer.json  tokenizer_config.json (with the chat template)  special_tokens.json
    hanlm_export.json  (source checkpoint, step, tokens seen, sha256 of model.safetensors)

Only the model weights are read from the checkpoint (not the optimizer state), into a model
built on the CPU without any process group; DCP reshards, so a checkpoint written by any number
of ranks (single process, DDP, FSDP2) loads the same way.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from pickle import UnpicklingError
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from transformers import GenerationConfig

from hanlm.chat import tokens
from hanlm.chat_template import SPECIAL_TOKENS_FILE, TOKENIZER_CONFIG_FILE
from hanlm.data.tokenizer import TOKENIZER_FILE
from hanlm.errors import UserError
from hanlm.files import (
    atomic_output_dir,
    atomic_write_json,
    claim_output_dir,
    file_sha256,
    fingerprint,
    read_json,
)
from hanlm.inference import load_folder
from hanlm.model import build_model, no_progress_bars
from hanlm.train import checkpoint_layout
from hanlm.train.lora import ADAPTER_FOLDER, Adapters
from hanlm.train.results import ExportRecord

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

STAGE = "export"
RECORD = ExportRecord.FILE


WEIGHTS = "model.safetensors"
# The checkpoint's state dict is {"model": ..., "optim": ...}; DCP flattens it to "model.<fqn>".
MODEL_PREFIX = "model."
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE)
# Copied along when a tokenizer folder has them (older transformers write the first).
OPTIONAL_TOKENIZER_FILES = ("special_tokens_map.json", "chat_template.jinja")
EXPORT_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# --- loading a checkpoint's weights ---------------------------------------------------------------


@contextlib.contextmanager
def _without_process_group() -> Iterator[None]:
    # DCP warns that it "assumes" a single process when there is no process group: we mean it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@contextlib.contextmanager
def _damage_is_a_user_error(checkpoint_dir: Path) -> Iterator[None]:
    """DCP reading a truncated or garbled file raises whatever torch's readers raise."""
    try:
        yield
    except (CheckpointException, RuntimeError, OSError, EOFError, ValueError, UnpicklingError) as e:
        lines = str(e).strip().splitlines()
        reason = lines[-1].split(". ")[0] if lines else type(e).__name__  # the gist, not a story
        raise UserError(
            f"cannot read the checkpoint's files, they are damaged ({reason})",
            where=str(checkpoint_dir),
            fix="use another checkpoint (a committed one is checked against its manifest "
            "first), or train again",
        ) from None


def checkpoint_tensor_shapes(checkpoint_dir: Path) -> dict[str, tuple[int, ...] | None]:
    """The model tensors a DCP checkpoint holds, by parameter name: their full (unsharded)
    shapes, None for an entry that is not a tensor."""
    with _damage_is_a_user_error(checkpoint_dir):
        metadata = dcp.FileSystemReader(str(checkpoint_dir)).read_metadata()
    shapes = {}
    for key, entry in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX):
            size = tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else None
            shapes[key.removeprefix(MODEL_PREFIX)] = size
    return shapes


def _tied_partners(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """For each name, the other names of the same storage (lm_head.weight <-> embed_tokens)."""
    by_storage: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        by_storage.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(name)
    return {
        name: [n for n in names if n != name] for names in by_storage.values() for name in names
    }


def _check_fits(
    state: dict[str, torch.Tensor], saved: dict[str, tuple[int, ...] | None], checkpoint_dir: Path
) -> None:
    """UserError naming the first tensor where the checkpoint and the config's model disagree."""
    fix = "export with the model preset or config.json the run was trained with (model.preset)"
    if not saved:
        raise UserError(
            "the checkpoint holds no model weights", where=str(checkpoint_dir), fix="export another"
        )
    partners = _tied_partners(state)
    for name, tensor in state.items():
        if name in saved:
            if saved[name] != tuple(tensor.shape):
                raise UserError(
                    f"the checkpoint's tensor {name} has shape {list(saved[name] or ())}, but the "
                    f"configured model's has {list(tensor.shape)}",
                    where=str(checkpoint_dir),
                    fix=fix,
                )
        elif not any(p in saved for p in partners[name]):
            raise UserError(
                f"the checkpoint has no tensor {name}, which the configured model needs",
                where=str(checkpoint_dir),
                fix=fix,
            )
    extra = sorted(set(saved) - set(state))
    if extra:
        raise UserError(
            f"the checkpoint holds tensors the configured model lacks: {', '.join(extra[:3])}"
            + (f" and {len(extra) - 3} more" if len(extra) > 3 else ""),
            where=str(checkpoint_dir),
            fix=fix,
        )


def load_checkpoint_model(checkpoint_dir: Path, config: PretrainedConfig) -> PreTrainedModel:
    """A CPU model of `config` (eval mode) holding the weights of a committed checkpoint."""
    model = build_model(config, device="cpu").eval()
    load_checkpoint_into(model, checkpoint_dir)
    return model


def load_checkpoint_adapters(checkpoint_dir: Path, config: PretrainedConfig, adapters: Adapters):
    """The PEFT model of `config` with `adapters` (eval mode) holding the weights of a committed
    LoRA checkpoint, whose state is that of the model with the adapters injected."""
    peft_model, injected = adapters.inject(build_model(config, device="cpu"))
    load_checkpoint_into(injected, checkpoint_dir)
    return peft_model.eval()


def load_checkpoint_into(model: torch.nn.Module, checkpoint_dir: Path) -> None:
    """Read a committed checkpoint's weights into `model` (on the CPU), checked against it."""
    checkpoint_dir = Path(checkpoint_dir)
    # DCP loads in place into these tensors: they share storage with the model's parameters.
    state = get_model_state_dict(model)
    saved = checkpoint_tensor_shapes(checkpoint_dir)
    _check_fits(state, saved, checkpoint_dir)
    request, aliases = _load_request(state, saved)
    with _without_process_group(), _damage_is_a_user_error(checkpoint_dir):
        # no_dist: every caller reads the whole model, even inside a distributed program
        dcp.load({"model": request}, checkpoint_id=str(checkpoint_dir), no_dist=True)
    _check_finite(request, checkpoint_dir)  # before the ties: NaN never equals its tied copy
    _check_ties(request, aliases, checkpoint_dir)


def _check_finite(tensors: dict[str, torch.Tensor], checkpoint_dir: Path) -> None:
    """UserError naming the tensors that hold NaN or inf: the training that wrote them diverged."""
    bad = [
        name
        for name, tensor in tensors.items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise UserError(
            f"the checkpoint's weights are not finite (NaN or inf in {', '.join(bad[:3])}{more}): "
            "the training that wrote it diverged",
            where=str(checkpoint_dir),
            fix="use an earlier checkpoint whose weights are finite, or train again with a lower "
            "learning rate (optimizer.lr; sft.optimizer.lr for SFT), a longer warm-up "
            "(warmup_steps), gradient clipping (grad_clip) or precision.mode bf16 or fp32",
        )


def _load_request(
    state: dict[str, torch.Tensor], saved: dict[str, tuple[int, ...] | None]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """What to read from the checkpoint, and which names are a tied tensor's second name.

    A tied tensor (one storage under two names) is read once into the model; where the
    checkpoint also holds the second name, that copy goes into a buffer of its own so the
    tie can be checked rather than silently letting one copy overwrite the other.
    """
    partners = _tied_partners(state)
    request: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        primary = next((p for p in partners[name] if p in request), None)
        if primary is None and name in saved:
            request[name] = tensor
        elif primary is not None and name in saved:
            request[name] = torch.empty_like(tensor)
            aliases[name] = primary
    return request, aliases


def _check_ties(
    request: dict[str, torch.Tensor], aliases: dict[str, str], checkpoint_dir: Path
) -> None:
    for alias, primary in aliases.items():
        if not torch.equal(request[alias], request[primary]):
            raise UserError(
                f"the checkpoint's {alias} differs from {primary}, but the configured model "
                "ties them (tie_word_embeddings)",
                where=str(checkpoint_dir),
                fix="export with a model config that sets tie_word_embeddings = false",
            )


# --- special tokens and tokenizer files -----------------------------------------------------------


def _special_tokens(tokenizer_dir: Path) -> dict:
    """A hanlm tokenizer's special_tokens.json; another model's, read from its chat template
    (hanlm.chat.foreign): its tokenizer files travel unchanged."""
    required = TOKENIZER_FILES if (tokenizer_dir / SPECIAL_TOKENS_FILE).is_file() else (
        TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)  # fmt: skip
    missing = [name for name in required if not (tokenizer_dir / name).is_file()]
    if missing:
        raise UserError(
            f"the tokenizer folder lacks {', '.join(missing)}",
            where=str(tokenizer_dir),
            fix="run `hanlm tokenizer` for this run first (its folder holds all three files)",
        )
    return tokens.load_special_tokens(tokenizer_dir)


def token_ids(special: dict, eos_token_ids: list[int] | None, vocab_size: int) -> dict[str, Any]:
    """bos/eos/pad ids for config.json and generation_config.json.

    eos is the end-of-document token unless the caller names the end tokens (a chat model
    ends its turns with <|eot|>); pad is <|pad|>, never an end token, so that padding is not
    mistaken for an answer's end.
    """
    eos = list(eos_token_ids) if eos_token_ids else [special["eod"]["id"]]
    pad = special["pad"]["id"]
    for token_id in eos:
        if not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise UserError(
                f"end-of-sequence token id {token_id!r} is not in the vocabulary (0..{vocab_size - 1})"
            )
    if pad in eos and pad != special["eod"]["id"]:  # another model may pad with its eos (Qwen)
        raise UserError(
            f"the padding token id {pad} is also given as an end-of-sequence token",
            fix="leave <|pad|> out of the end tokens",
        )
    return {
        "bos_token_id": special["bos"]["id"] if "bos" in special else None,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": pad,
    }


def _copy_tokenizer(tokenizer_dir: Path, out_dir: Path, context_length: int | None) -> None:
    for name in (*TOKENIZER_FILES, *OPTIONAL_TOKENIZER_FILES):
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out_dir / name)
    if context_length:
        # The tokenizer stage leaves the length open ("the model sets one"): the export does.
        config = read_json(out_dir / TOKENIZER_CONFIG_FILE)
        config["model_max_length"] = context_length
        atomic_write_json(out_dir / TOKENIZER_CONFIG_FILE, config)


# --- export ---------------------------------------------------------------------------------------


def _checked_dtype(dtype: torch.dtype) -> str:
    if dtype not in EXPORT_DTYPES:
        raise UserError(
            f"cannot export weights as {dtype}",
            fix=f"use one of {', '.join(EXPORT_DTYPES.values())}",
        )
    return EXPORT_DTYPES[dtype]


def trainer_state(checkpoint_dir: Path) -> dict:
    path = Path(checkpoint_dir) / checkpoint_layout.TRAINER_STATE
    if not path.is_file() or not (Path(checkpoint_dir) / ".metadata").is_file():
        raise UserError(
            f"{checkpoint_dir} is not a committed checkpoint (no {path.name} or DCP .metadata)",
            fix="give a step-NNNNNNNN folder from a run's pretrain/checkpoints",
        )
    return read_json(path)


def export_fingerprint(
    checkpoint_dir: Path,
    config: PretrainedConfig,
    tokenizer_dir: Path,
    eos_token_ids: list[int] | None,
    dtype: torch.dtype,
) -> str:
    """What an export is made of: the checkpoint's files (name, size, mtime; cheaper than
    hashing gigabytes, and a retrained step has new files), the model config, the tokenizer
    and the export settings."""
    checkpoint_dir = Path(checkpoint_dir)
    files = sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        for p in checkpoint_dir.iterdir()
        if p.is_file()
    )
    return fingerprint(
        STAGE,
        checkpoint_dir.name,
        files,
        config.to_dict(),
        file_sha256(Path(tokenizer_dir) / TOKENIZER_FILE),
        eos_token_ids,
        _checked_dtype(dtype),
    )


def export_checkpoint(
    checkpoint_dir: Path,
    out_dir: Path,
    *,
    model_config: PretrainedConfig,
    tokenizer_dir: Path,
    eos_token_ids: list[int] | None = None,
    dtype: torch.dtype = torch.float32,
    replace_earlier: bool = True,
    adapters: Adapters | None = None,
) -> Path:
    """Write the checkpoint's model, `dtype` weights, and the tokenizer to `out_dir` (atomically).

    `out_dir` must be new, empty or an earlier export (replaced only with `replace_earlier`).
    """
    claim_output_dir(out_dir, marker=RECORD, replace_earlier=replace_earlier)
    with atomic_output_dir(out_dir, marker=RECORD, replace_earlier=replace_earlier) as tmp:
        write_export(
            checkpoint_dir, tmp, model_config=model_config, tokenizer_dir=tokenizer_dir,
            eos_token_ids=eos_token_ids, dtype=dtype, adapters=adapters,
        )  # fmt: skip
    return Path(out_dir)


def write_export(
    checkpoint_dir: Path,
    folder: Path,
    *,
    model_config: PretrainedConfig,
    tokenizer_dir: Path,
    eos_token_ids: list[int] | None = None,
    dtype: torch.dtype = torch.float32,
    adapters: Adapters | None = None,
) -> ExportRecord:
    """The export written into the empty folder `folder` (a temporary one its caller renames
    into place); its record (RECORD's content). A LoRA checkpoint (`adapters`) is written with
    its adapters merged, and the adapter alone, as PEFT saves it, in ADAPTER_FOLDER."""
    checkpoint_dir, tokenizer_dir, folder = Path(checkpoint_dir), Path(tokenizer_dir), Path(folder)
    dtype_name = _checked_dtype(dtype)
    state = trainer_state(checkpoint_dir)
    special = _special_tokens(tokenizer_dir)
    vocab_size = model_config.get_text_config().vocab_size
    if special["vocab_size"] > vocab_size:
        raise UserError(
            f"the tokenizer has {special['vocab_size']:,} tokens but the model only {vocab_size:,}",
            where=str(tokenizer_dir),
            fix="export with the tokenizer the run was trained with",
        )
    ids = token_ids(special, eos_token_ids, vocab_size)
    fp = export_fingerprint(checkpoint_dir, model_config, tokenizer_dir, eos_token_ids, dtype)

    if adapters is None:
        model = load_checkpoint_model(checkpoint_dir, model_config)
    else:
        peft_model = load_checkpoint_adapters(checkpoint_dir, model_config, adapters)
        adapters.save(peft_model, folder / ADAPTER_FOLDER)
        model = adapters.merged(peft_model)
    model = model.to(dtype)
    for key, value in ids.items():
        setattr(model.config, key, value)
    model.generation_config = GenerationConfig(**ids)
    context_length = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    with no_progress_bars():
        model.save_pretrained(folder, safe_serialization=True)
    _portable_model_config(folder / "config.json", dtype_name)
    _copy_tokenizer(tokenizer_dir, folder, context_length)
    record = ExportRecord(
        source_checkpoint=str(checkpoint_dir.resolve()),
        step=state.get("step"),
        tokens=state.get("tokens"),
        model_sha256=file_sha256(folder / WEIGHTS),
        dtype=dtype_name,
        **ids,
        fingerprint=fp,
        exported_at=time.time(),
    )
    record.write(folder / RECORD)
    return record


def _portable_model_config(path: Path, dtype_name: str) -> None:
    """Also spell the RoPE settings and dtype the way transformers 4 reads them.

    transformers 5 writes them only inside `rope_parameters` and as `dtype`; a consumer on
    transformers 4 (an older vLLM, llama.cpp's converter) would silently fall back to the
    default rope_theta of 10,000, and the larger presets train with 500,000. transformers 5
    reads the old spellings too and keeps its own.
    """
    config = read_json(path)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    config.setdefault("torch_dtype", dtype_name)
    atomic_write_json(path, config)


def load_exported(out_dir: Path) -> PreTrainedModel:
    """The exported model, loaded as any transformers user would; nothing is unpickled."""
    return load_folder(out_dir, tokenizer=False, quiet=True).model
