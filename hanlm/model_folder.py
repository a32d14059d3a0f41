"""A Hugging Face model folder checked before anything loads it.

Every command that loads a model folder (generate, chat, eval, doctor, SFT from an exported
model, a distillation teacher) calls `check_model_folder` first, so that a damaged or unsafe
folder is one clear UserError rather than a traceback from deep inside transformers:

* config.json exists and is a JSON object;
* the weights are safetensors (`model.safetensors`, or shards listed by
  `model.safetensors.index.json`); pickle weights (`pytorch_model.bin`, `.pt`, ...) are refused,
  since unpickling a file can run code;
* every safetensors file has a readable header whose tensors fit the file (safetensors' own
  `safe_open` checks the header, shapes, offsets and the file's length), and a sharded index
  names only shards that exist and hold the tensors it places there;
* the folder has tokenizer files (when the caller needs a tokenizer).

Only headers are read: checking a folder costs milliseconds, whatever the model's size.

A model may also be named by its Hugging Face Hub id (`org/name`, where no such local folder
exists): its config, safetensors weights and tokenizer files are fetched into the Hub cache
(huggingface_hub's `snapshot_download`, which honours HF_HUB_OFFLINE and reuses the cache) and
that snapshot is checked like any folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from hanlm import remote_code
from hanlm.errors import UserError
from hanlm.files import file_mismatch

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# a LoRA fine-tune's export keeps the adapter alone here, as PEFT saves it (hanlm.train.lora)
ADAPTER_FOLDER = "adapter"
# Weights hanlm never loads: pickles, and formats transformers only reads through another framework.
UNSAFE_WEIGHTS = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.pkl",
    "tf_model.h5",
    "flax_model.msgpack",
)
# One of these makes a tokenizer transformers can load (fast JSON, sentencepiece, BPE or WordPiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)
# Checked as JSON: a damaged one makes transformers or tokenizers raise their own exceptions.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

CONVERT_FIX = (
    "convert the weights to safetensors where you trust the file, with transformers: "
    "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)"
)
TOKENIZER_FIX = (
    "put the model's tokenizer files (tokenizer.json and tokenizer_config.json) in the folder: "
    "`hanlm export` writes them; for another model, "
    "AutoTokenizer.from_pretrained(SOURCE).save_pretrained(DIR)"
)


def is_model_folder(path: str | Path) -> bool:
    """Whether `path` looks like a Hugging Face model folder (it holds a config.json): the cheap
    test for choosing among candidate folders; `check_model_folder` checks one before loading."""
    return (Path(path) / CONFIG).is_file()


def check_tokenizer_folder(path: str | Path) -> Path:
    """The folder, once it is known to hold tokenizer files transformers can load (readable
    JSON where they are JSON); a UserError saying what is wrong otherwise."""
    path = Path(path)
    if not path.is_dir():
        state = "it is a file, not a folder" if path.exists() else "it does not exist"
        raise UserError(
            f"{path} is not a tokenizer folder: {state}",
            fix="give the folder the tokenizer stage or `hanlm export` wrote",
        )
    _check_tokenizer(path, what="the tokenizer folder")
    return path


# what a model needs, never pickle weights (the check refuses those anyway)
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(name: str | Path) -> bool:
    """Whether `name` reads as a Hub model id (org/name) rather than a local path."""
    text = str(name)
    return bool(_HUB_ID.match(text)) and not Path(text).exists() and ".." not in text


def from_hub(repo: str) -> Path:
    """The cached snapshot of Hub model `repo` (fetched when online); a UserError saying how to
    get it when offline and not cached, or when the Hub has no such model."""
    from huggingface_hub import snapshot_download  # deferred: only for Hub ids
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        # a model's own code comes only where the recipe trusts it (hanlm.remote_code)
        patterns = [*HUB_FILES, "*.py"] if remote_code.allowed() else HUB_FILES
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except LocalEntryNotFoundError:
        raise UserError(
            f"no folder {repo} here, and the Hugging Face model {repo} is not in the Hub cache "
            "(offline: HF_HUB_OFFLINE is set, or the Hub cannot be reached)",
            fix=f"where you are online, `hf download {repo}` (the same HF_HOME), or "
            f"`hf download {repo} --local-dir DIR` and give DIR",
        ) from None
    except (HfHubHTTPError, ValueError) as e:
        raise UserError(
            f"no folder {repo} here, and the Hugging Face Hub has no model {repo} that can be "
            f"read: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            fix="check the name (and `hf auth login` for a gated or private model), or give a "
            "local model folder",
        ) from None


def check_model_folder(path: str | Path, *, tokenizer: bool = True) -> Path:
    """The folder, once it is known to hold a loadable config, safetensors weights and (with
    `tokenizer`) tokenizer files; a UserError saying what is wrong and how to fix it otherwise.
    A Hub id (org/name) names the Hub cache's snapshot of that model (`from_hub`)."""
    if is_hub_id(path):
        path = from_hub(str(path))
    path = Path(path)
    if not path.is_dir():
        state = "it is a file, not a folder" if path.exists() else "it does not exist"
        raise UserError(
            f"{path} is not a Hugging Face model folder: {state}",
            fix="give a Hugging Face model folder (config.json, model.safetensors, tokenizer), "
            "such as the one `hanlm export` writes (RUN/pretrain/hf or RUN/sft/hf)",
        )
    if not (path / CONFIG).is_file():
        raise UserError(
            f"{path} is not a Hugging Face model folder (no {CONFIG})",
            fix="give the folder `hanlm export` wrote (RUN/pretrain/hf or RUN/sft/hf) or any "
            "local transformers causal LM folder",
        )
    config = _read_json(path / CONFIG, "the model's config")
    if not isinstance(config, dict):
        raise UserError(
            f"{CONFIG} holds {type(config).__name__}, not a JSON object",
            where=str(path / CONFIG),
            fix=_resave_fix(path),
        )
    _check_weights(path)
    problem = export_damage(path)
    if problem is not None:
        raise UserError(
            f"the model folder is damaged: {problem}", where=str(path), fix=_resave_fix(path)
        )
    if tokenizer:
        _check_tokenizer(path)
    return path


EXPORT_RECORD = "hanlm_export.json"  # written by `hanlm export` (hanlm.train.export.RECORD)


def export_damage(folder: str | Path) -> str | None:
    """What is wrong with the weights of a folder `hanlm export` wrote: model.safetensors must
    still have the sha256 its hanlm_export.json records. None when it does, or when the folder
    is not one hanlm exported (nothing recorded to check against)."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / EXPORT_RECORD).read_text(encoding="utf-8"))
        sha = recorded["model_sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return file_mismatch(folder / WEIGHTS, {"sha256": sha})


def _read_json(path: Path, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{what} is not valid JSON ({e.msg}): the file is damaged",
            where=f"{path}:{e.lineno}",
            fix=_resave_fix(path.parent),
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(
            f"cannot read {what}: {e}", where=str(path), fix=_resave_fix(path.parent)
        ) from None


def _resave_fix(folder: Path) -> str:
    if (folder / EXPORT_RECORD).is_file():
        return "export the model again (`hanlm export`), or copy the folder again"
    return "copy or download the folder again, or save the model again with save_pretrained"


# --- weights --------------------------------------------------------------------------------------


def _check_weights(folder: Path) -> None:
    if (folder / WEIGHTS_INDEX).is_file():
        _check_sharded(folder)
        return
    if (folder / WEIGHTS).exists():
        check_safetensors(folder / WEIGHTS)
        return
    unsafe = sorted({p.name for pattern in UNSAFE_WEIGHTS for p in folder.glob(pattern)})
    if unsafe:
        raise UserError(
            f"{folder} has no safetensors weights, only {', '.join(unsafe)}: hanlm loads "
            "safetensors only, because loading a pickle file can run any code in it",
            fix=CONVERT_FIX,
        )
    raise UserError(
        f"{folder} has no safetensors weights ({WEIGHTS} or {WEIGHTS_INDEX})",
        fix="save the model into the folder with save_pretrained(DIR, safe_serialization=True) "
        "(`hanlm export` does)",
    )


def _check_sharded(folder: Path) -> None:
    index_path = folder / WEIGHTS_INDEX
    index = _read_json(index_path, "the weights index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(
            "the weights index has no weight_map (tensor name -> shard file)",
            where=str(index_path),
            fix=_resave_fix(folder),
        )
    by_shard: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or "/" in shard:
            raise UserError(
                f"the weights index places {tensor} in {shard!r}, not a safetensors file "
                "of this folder",
                where=str(index_path),
                fix=_resave_fix(folder),
            )
        by_shard.setdefault(shard, set()).add(tensor)
    for shard, tensors in sorted(by_shard.items()):
        if not (folder / shard).is_file():
            raise UserError(
                f"the weights index names the shard {shard}, which is missing",
                where=str(index_path),
                fix=_resave_fix(folder),
            )
        missing = sorted(tensors - check_safetensors(folder / shard))
        if missing:
            raise UserError(
                f"the shard {shard} lacks {len(missing)} tensors the weights index places in it "
                f"(e.g. {missing[0]})",
                where=str(folder / shard),
                fix=_resave_fix(folder),
            )


def check_safetensors(path: Path) -> set[str]:
    """The tensor names in a safetensors file, after safetensors itself has checked its header
    against the file (every tensor's shape, type and byte range, and the file's length)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return set(f.keys())
    except (SafetensorError, OSError) as e:
        raise UserError(
            f"the weights file {path.name} is damaged: {_safetensors_damage(path, e)}",
            where=str(path),
            fix=_resave_fix(path.parent),
        ) from None


def _safetensors_damage(path: Path, error: Exception) -> str:
    """What is wrong, in words: the header's own sizes against the file's, else safetensors'
    message."""
    reason = str(error).removeprefix("Error while deserializing header: ")
    try:
        size = path.stat().st_size
        if size < 8:
            return f"it has {size} bytes, too few for a safetensors header"
        with open(path, "rb") as f:
            header_length = int.from_bytes(f.read(8), "little")
            if 8 + header_length > size:
                return (
                    f"its header claims {header_length:,} bytes, more than the file's {size:,} "
                    "(the header is garbled, or the file cut short)"
                )
            header = json.loads(f.read(header_length))
        end = max(
            int(entry["data_offsets"][1])
            for name, entry in header.items()
            if name != "__metadata__"
        )
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return reason  # the header itself is garbled: safetensors says how
    expected = 8 + header_length + end
    if size < expected:
        return f"truncated: it has {size:,} bytes, its header describes {expected:,}"
    return reason


# --- tokenizer ------------------------------------------------------------------------------------


def _check_tokenizer(folder: Path, what: str = "the model folder") -> None:
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(
            f"{what} {folder} has no tokenizer files (none of "
            f"{', '.join(TOKENIZER_FILES[:2])}, ...)",
            fix=TOKENIZER_FIX,
        )
    for name in TOKENIZER_JSON:
        if (folder / name).is_file():
            _read_json(folder / name, name)


def vocab_rows(path: Path) -> int:
    """The vocabulary rows the config.json of model folder `path` names (a multimodal model's
    in its text_config)."""
    config = _read_json(Path(path) / CONFIG, "the model's config")
    text = config.get("text_config") if "vocab_size" not in config else config
    try:
        return int(text["vocab_size"])
    except (KeyError, TypeError, ValueError):
        raise UserError(
            f"the model's {CONFIG} names no vocab_size", where=str(Path(path) / CONFIG)
        ) from None
