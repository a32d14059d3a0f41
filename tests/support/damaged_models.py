"""Model folders damaged the ways a user's can be, each made from a copy of a healthy folder,
with a phrase the UserError must contain. Shared by the tests of every command that loads a
model folder (generate, eval, doctor, SFT, distillation)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

WEIGHTS = "model.safetensors"


def _cut_weights(folder: Path) -> None:
    path = folder / WEIGHTS
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _garble_header(folder: Path) -> None:
    path = folder / WEIGHTS
    data = bytearray(path.read_bytes())
    data[8:40] = b"#" * 32  # the JSON header's first bytes
    path.write_bytes(bytes(data))


def _huge_header_length(folder: Path) -> None:
    path = folder / WEIGHTS
    path.write_bytes(b"\xff" * 8 + path.read_bytes()[8:])


def _empty_weights(folder: Path) -> None:
    (folder / WEIGHTS).write_bytes(b"")


def _pickle_weights(folder: Path) -> None:
    (folder / WEIGHTS).unlink()
    torch.save({"lm_head.weight": torch.zeros(2, 2)}, folder / "pytorch_model.bin")


def _missing_shard(folder: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(folder / WEIGHTS), framework="pt") as f:
        names = sorted(f.keys())
    first = "model-00001-of-00002.safetensors"
    (folder / WEIGHTS).rename(folder / first)
    weight_map = {name: first for name in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"  # never written
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _no_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens.json"):
        (folder / name).unlink(missing_ok=True)


def _garble_config(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "llama", ')


def _garble_tokenizer(folder: Path) -> None:
    path = folder / "tokenizer.json"
    path.write_text(path.read_text()[:100])


# name -> (damage, phrase of the error message)
DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated weights": (_cut_weights, "truncated"),
    "garbled header": (_garble_header, "model.safetensors is damaged"),
    "huge header length": (_huge_header_length, "its header claims"),
    "empty weights": (_empty_weights, "too few for a safetensors header"),
    "pickle weights": (_pickle_weights, "safe_serialization=True"),
    "missing shard": (_missing_shard, "model-00002-of-00002.safetensors, which is missing"),
    "no tokenizer": (_no_tokenizer, "no tokenizer files"),
    "garbled config": (_garble_config, "not valid JSON"),
    "garbled tokenizer": (_garble_tokenizer, "tokenizer.json is not valid JSON"),
}
# What a loader that needs no tokenizer (SFT's source, a teacher) must still refuse.
WEIGHT_DAMAGES = [name for name in DAMAGES if "tokenizer" not in name]


def damaged_copy(healthy: Path, target: Path, name: str) -> tuple[Path, str]:
    """A copy of `healthy` at `target` with damage `name`, and the phrase its error names."""
    shutil.copytree(healthy, target)
    damage, phrase = DAMAGES[name]
    damage(target)
    return target, phrase
