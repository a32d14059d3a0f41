"""The shard manifest's format: `manifest.json` of a shards folder, and reading it checked.

`hanlm shards` (hanlm.data.shards) writes the manifest: per split its token files, each with
its corpus source and token count, the token dtype, the tokenizer's sha256 and the
end-of-document id. The token loader (hanlm.data.loader) and the training mix
(hanlm.data.mixture) read it here: `read_manifest` refuses a missing, unreadable or
other-format manifest, `split_files` a split whose files are missing or not the size it
records, and `source_windows` counts each source's training windows, what a mix is planned
with. Every refusal is a UserError that says to rebuild the shards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hanlm.errors import UserError

SUPPORTED_DTYPES = ("uint16", "uint32")
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2  # 2: each token file names its corpus source

REBUILD_SHARDS = "re-run `hanlm shards --force` to rebuild the shards"


def parse_dtype(dtype: Any, *, where: str | None = None) -> np.dtype:
    """The token dtype, one of SUPPORTED_DTYPES; a UserError for any other."""
    try:
        parsed = np.dtype(dtype)
    except TypeError:
        parsed = None
    if parsed is None or parsed.name not in SUPPORTED_DTYPES:
        raise UserError(
            f"token dtype {dtype!r} is not supported (expected one of {SUPPORTED_DTYPES})",
            where=where,
            fix=REBUILD_SHARDS,
        )
    return parsed


def read_manifest(shards_dir: Path) -> dict[str, Any]:
    """The manifest of a shards folder, refused when missing, unreadable or of another format."""
    path = shards_dir / MANIFEST_NAME
    if not path.is_file():
        raise UserError("no shard manifest found", where=str(path), fix="run `hanlm shards` first")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(
            f"the shard manifest cannot be read ({err})",
            where=str(path),
            fix="run `hanlm shards` first, or `hanlm shards --force` to rebuild it",
        ) from err
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise UserError(
            f"the shard manifest is not in format {MANIFEST_FORMAT}",
            where=str(path),
            fix=REBUILD_SHARDS,
        )
    return manifest


def end_of_document_id(manifest: dict[str, Any], shards_dir: Path) -> int:
    """The end-of-document token id the manifest names (document masking needs it)."""
    eod = manifest.get("eod_id")
    if isinstance(eod, bool) or not isinstance(eod, int) or eod < 0:
        raise UserError(
            f"the shard manifest names no end-of-document token id (eod_id is {eod!r}), so "
            "document masking cannot tell where documents end",
            where=str(shards_dir / MANIFEST_NAME),
            fix=f"{REBUILD_SHARDS}, or set pretrain.document_masking = false",
        )
    return eod


def check_tokenizer(manifest: dict[str, Any], expected_sha256: str, shards_dir: Path) -> None:
    """Refuse shards encoded with another tokenizer than the one of sha256 `expected_sha256`."""
    found = manifest.get("tokenizer_sha256")
    if found != expected_sha256:
        raise UserError(
            f"the shards were made with another tokenizer (sha256 {found!r}, "
            f"expected {expected_sha256!r})",
            where=str(shards_dir / MANIFEST_NAME),
            fix="re-run `hanlm shards --force` with the current tokenizer",
        )


def source_windows(shards_dir: Path, seq_len: int, split: str = "train") -> dict[str, int]:
    """Windows of `seq_len + 1` tokens (the loader's samples) per corpus source in a split, in
    the manifest's order: what a mixture is planned with."""
    shards_dir = Path(shards_dir)
    manifest = read_manifest(shards_dir)
    dtype = parse_dtype(manifest.get("dtype"), where=str(shards_dir / MANIFEST_NAME))
    files, sources = split_files(manifest, split, shards_dir, dtype)
    windows: dict[str, int] = {}
    for path, source in zip(files, sources, strict=True):
        tokens = path.stat().st_size // dtype.itemsize
        windows[source] = windows.get(source, 0) + max(tokens - 1, 0) // seq_len
    return windows


def split_files(
    manifest: dict[str, Any], split: str, shards_dir: Path, dtype: np.dtype
) -> tuple[list[Path], list[str]]:
    """The split's files, each checked to exist with exactly the size the manifest records, and
    the corpus source of each."""
    manifest_path = str(shards_dir / MANIFEST_NAME)
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or split not in splits:
        known = sorted(splits) if isinstance(splits, dict) else []
        raise UserError(
            f"the shards have no split {split!r} (they have {known})",
            where=manifest_path,
            fix="use one of the listed splits, or re-run `hanlm shards` with that split",
        )
    entries = splits[split].get("files") if isinstance(splits[split], dict) else None
    if not isinstance(entries, list):
        raise UserError(f"split {split!r} lists no files", where=manifest_path, fix=REBUILD_SHARDS)

    files, sources = [], []
    total_tokens = 0
    for entry in entries:
        try:
            path, tokens = shards_dir / entry["path"], int(entry["tokens"])
            sources.append(str(entry["source"]))
        except (TypeError, KeyError, ValueError) as err:
            raise UserError(
                f"a file entry of split {split!r} is malformed: {entry!r}",
                where=manifest_path,
                fix=REBUILD_SHARDS,
            ) from err
        _check_shard_file(path, tokens, dtype)
        files.append(path)
        total_tokens += tokens
    if total_tokens == 0:
        raise UserError(
            f"split {split!r} holds no tokens",
            where=manifest_path,
            fix="give that split some data and re-run `hanlm shards --force`",
        )
    return files, sources


def _check_shard_file(path: Path, tokens: int, dtype: np.dtype) -> None:
    if not path.is_file():
        raise UserError(
            "a shard file listed in the manifest is missing", where=str(path), fix=REBUILD_SHARDS
        )
    expected = tokens * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise UserError(
            f"shard file has {size} bytes but the manifest records {tokens} {dtype.name} tokens "
            f"({expected} bytes); it was truncated or overwritten",
            where=str(path),
            fix=REBUILD_SHARDS,
        )
