"""Atomic file and folder writes, compressed streams, and stage completion markers.

Nothing half-written is ever read as complete: every output goes to a temporary name, is fsynced,
then renamed into place.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

STAGE_MARKER = "stage.json"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def replace_dir(final: Path, tmp: Path) -> None:
    """Fsync everything in `tmp`, then put it in place of `final` (kept as `.old` until done)."""
    _fsync_tree(tmp)
    old = final.with_name(f"{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces `final` in one rename.

    On an exception the temporary folder is removed and `final` (if any) is left untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.incomplete")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(final, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (configs, upstream fingerprints)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_stage_marker(stage_dir: Path, stage: str, fp: str, **extra: Any) -> None:
    """Written last inside a stage's (temporary) folder: the stage is complete for `fp`."""
    marker = {"stage": stage, "fingerprint": fp, "finished_at": time.time(), **extra}
    atomic_write_json(Path(stage_dir) / STAGE_MARKER, marker)


def stage_fingerprint(stage_dir: Path) -> str | None:
    """The fingerprint a complete stage folder was made with, or None when it is not complete."""
    marker = Path(stage_dir) / STAGE_MARKER
    if not marker.is_file():
        return None
    try:
        return read_json(marker)["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def open_text_stream(path: Path) -> IO[bytes]:
    """Open a possibly .gz or .zst compressed file as a binary stream of its decompressed bytes."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        raw = open(path, "rb")  # noqa: SIM115 - closed together with the reader below
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader)
    return open(path, "rb")


def strip_compression_suffix(name: str) -> str:
    lower = name.lower()
    for suffix in (".gz", ".zst"):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name
