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
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from hanlm.errors import UserError

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


def file_record(path: Path) -> dict:
    """What a finished file is: its size and sha256, recorded so that a later run can check it
    before reusing the file."""
    return {"size": Path(path).stat().st_size, "sha256": file_sha256(path)}


def file_mismatch(path: Path, record: dict, *, checksum: bool = True) -> str | None:
    """None when `path` has the size and (with `checksum`) the sha256 that `record` holds, else
    what is wrong with it. What the record lacks is not checked.

    Stages that reuse finished output check sizes only (cheap: it catches truncation, and
    hashing gigabytes on every rerun would cost more than it finds); a resumed stage reusing
    the parts of an interrupted run checks checksums too."""
    path = Path(path)
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    if "size" in record and size != record["size"]:
        return f"{path.name} has {size:,} bytes, {record['size']:,} were written"
    if checksum and "sha256" in record and file_sha256(path) != record["sha256"]:
        return f"{path.name} fails its sha256 checksum"
    return None


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


class DamagedCompressedFile(UserError):
    """A compressed file that ends early or fails its checksum: it cannot be read to its end."""

    def __init__(self, path: Path, detail: str):
        self.path, self.detail = Path(path), detail
        super().__init__(
            f"the compressed file is damaged ({detail})",
            where=str(path),
            fix="copy or download it again (`gzip -t` or `zstd -t` checks a file), or leave it out",
        )

    def __reduce__(self):  # raised in worker processes: must cross back to the parent intact
        return (type(self), (self.path, self.detail))


class _CheckedGzip(io.RawIOBase):
    """A gzip file's decompressed bytes; gzip checks every member's CRC and length as it ends,
    and a file cut short or failing that check raises DamagedCompressedFile."""

    def __init__(self, path: Path):
        self._path = path
        self._gzip = gzip.open(path, "rb")  # noqa: SIM115 - closed in close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            # read1: at most one step of decompression, so what came before damage is handed out
            data = self._gzip.read1(len(buffer))
        except EOFError:
            raise DamagedCompressedFile(
                self._path, "truncated: it ends inside a gzip member"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise DamagedCompressedFile(self._path, f"gzip: {e}") from None
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._gzip.close()
        super().close()


class _CheckedZstd(io.RawIOBase):
    """Every zstd frame of a file, decompressed; a frame cut short by the end of the file, a
    checksum mismatch or bytes that are not zstd raise DamagedCompressedFile.

    zstandard's stream_reader stops quietly at the end of the input even inside a frame, so
    truncation would pass unnoticed: frames are decoded one by one here and the last one must
    end with the file."""

    _INPUT_CHUNK = 1 << 16  # compressed bytes per step: bounds the memory one step decodes into

    def __init__(self, path: Path):
        import zstandard

        self._zstd = zstandard
        self._path = path
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._frame = None  # the decompressor of the frame in progress
        self._pending = memoryview(b"")  # decompressed bytes not yet handed out
        self._at_end = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending and not self._at_end:
            self._pending = memoryview(self._decode_next_chunk())
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _decode_next_chunk(self) -> bytes:
        chunk = self._file.read(self._INPUT_CHUNK)
        if not chunk:
            self._at_end = True
            if self._frame is not None:
                raise DamagedCompressedFile(self._path, "truncated: it ends inside a zstd frame")
            return b""
        out = []
        try:
            while chunk:
                if self._frame is None:
                    self._frame = self._zstd.ZstdDecompressor().decompressobj()
                out.append(self._frame.decompress(chunk))
                if self._frame.eof:  # the next frame starts in what this one left over
                    chunk = self._frame.unused_data
                    self._frame = None
                else:
                    chunk = b""
        except self._zstd.ZstdError as e:
            raise DamagedCompressedFile(self._path, str(e)) from None
        return b"".join(out)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def open_text_stream(path: Path) -> IO[bytes]:
    """Open a possibly .gz or .zst compressed file as a binary stream of its decompressed bytes.

    Compressed files are checked as they are read: reading one to its end raises
    DamagedCompressedFile (a UserError) when it is truncated or fails its checksum."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        return io.BufferedReader(_CheckedGzip(path), buffer_size=1 << 16)
    if name.endswith(".zst"):
        return io.BufferedReader(_CheckedZstd(path), buffer_size=1 << 16)
    return open(path, "rb")


def strip_compression_suffix(name: str) -> str:
    lower = name.lower()
    for suffix in (".gz", ".zst"):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name
