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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import zstandard

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


# --- output paths: never lose what hanlm did not write ----------------------------------------
#
# Every folder or file hanlm replaces goes through claim_output_dir or claim_output_file first:
# a path that holds something else (a user's files, a file where a folder belongs) is refused
# with a UserError before any work is done, and again just before the swap.

OUTPUT_FILES_KEY = "output_files"  # in a folder's marker: the entries hanlm wrote there
IN_PROGRESS_TAG = ".hanlm-in-progress"  # inside a temporary folder while hanlm fills it
LISTED_NAMES = 5  # entries named in a message before "and N more"


def _listing(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return shown + (f" and {more} more" if more > 0 else "")


def _first_non_folder(paths) -> Path | None:
    """The first of `paths` (a path, then the folders above it) that exists but is no folder."""
    for candidate in paths:
        if candidate.is_dir():
            return None
        if os.path.lexists(candidate):
            return candidate
    return None


def _blocked_by_file(path: Path, name: str, blocker: Path) -> UserError:
    what = (
        f"{name} {path} is a file, not a folder"
        if blocker == path
        else f"{name} {path} cannot be created: {blocker} is a file, not a folder"
    )
    return UserError(what, fix="choose another path, or move the file away")


def check_folder_path(path: Path, name: str) -> None:
    """UserError when `path`, or a folder above it, exists as something other than a folder
    (a file, a broken link): nothing could be written there."""
    path = Path(path)
    blocker = _first_non_folder((path, *path.parents))
    if blocker is not None:
        raise _blocked_by_file(path, name, blocker)


def _hanlm_marker(path: Path) -> dict | None:
    """The marker's record when `path` is one hanlm wrote (a JSON object with a fingerprint)."""
    try:
        record = read_json(path)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "fingerprint" in record else None


def claim_output_dir(
    path: Path,
    *,
    marker: str = STAGE_MARKER,
    replace_earlier: bool = True,
    name: str = "output folder",
) -> None:
    """Refuse (UserError) to write folder `path` unless it is new, empty, or hanlm's own earlier
    output: it holds hanlm's `marker` and nothing hanlm did not list there when it wrote it.

    replace_earlier=False also refuses hanlm's own earlier output: what a user-named `--out`
    held is replaced only with --force."""
    path = Path(path)
    check_folder_path(path, name)
    if not path.is_dir():
        return
    entries = [p.name for p in path.iterdir()]
    if not entries:
        return
    record = _hanlm_marker(path / marker)
    if record is None:
        raise UserError(
            f"{name} {path} already holds files hanlm did not write ({_listing(entries)}), and "
            "hanlm replaces only its own earlier output",
            fix="choose a new or an empty folder, or move those files elsewhere first",
        )
    recorded = record.get(OUTPUT_FILES_KEY)
    if isinstance(recorded, list):  # outputs written before the list was kept: all hanlm's
        foreign = [e for e in entries if e not in {*recorded, marker}]
        if foreign:
            raise UserError(
                f"{name} {path} holds an earlier hanlm output and also files hanlm did not "
                f"write there ({_listing(foreign)})",
                fix="move those files out of the folder first, or choose another folder",
            )
    if not replace_earlier:
        raise UserError(
            f"{name} {path} holds an earlier hanlm output",
            fix="pass --force to replace it, or choose another folder",
        )


def claim_output_file(
    path: Path,
    *,
    is_earlier_output: Callable[[Path], bool],
    replace_earlier: bool,
    name: str = "output file",
) -> None:
    """Refuse (UserError) to write file `path` unless it is new, or an earlier output of the
    same command (`is_earlier_output(path)`) and replace_earlier is set (--force)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(
            f"{name} {path} is a folder, not a file", fix="give a file path, e.g. inside it"
        )
    blocker = _first_non_folder(path.parents)
    if blocker is not None:
        raise _blocked_by_file(path, name, blocker)
    if not os.path.lexists(path):
        return
    if not path.is_file() or not is_earlier_output(path):
        raise UserError(
            f"{name} {path} already exists and is not hanlm's output, so it is kept",
            fix="choose another path, or move the file away first",
        )
    if not replace_earlier:
        raise UserError(f"{name} {path} holds an earlier output", fix="pass --force to replace it")


def _record_output_files(folder: Path, marker: str) -> None:
    """List the folder's entries in its marker, so that a later run can tell them from files
    someone else puts there."""
    record = _hanlm_marker(folder / marker)
    if record is not None:  # without one the folder is not recognised as hanlm's anyway
        record[OUTPUT_FILES_KEY] = sorted(p.name for p in folder.iterdir())
        atomic_write_json(folder / marker, record)


def replace_dir(
    final: Path, tmp: Path, *, marker: str = STAGE_MARKER, replace_earlier: bool = True
) -> None:
    """Fsync everything in `tmp`, then put it in place of `final` (see claim_output_dir), which
    is kept under a fresh name until the new folder is in place."""
    final, tmp = Path(final), Path(tmp)
    claim_output_dir(final, marker=marker, replace_earlier=replace_earlier)
    (tmp / IN_PROGRESS_TAG).unlink(missing_ok=True)
    _record_output_files(tmp, marker)
    _fsync_tree(tmp)
    # a fresh name: a fixed `.old` could be someone's folder
    old = final.with_name(f"{final.name}.old-{os.getpid()}-{time.time_ns()}")
    if os.path.lexists(final):
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _claim_temporary_dir(tmp: Path) -> None:
    """An earlier run's leftover `tmp` is removed; anything else at that name is refused."""
    if not os.path.lexists(tmp):
        return
    is_real_dir = tmp.is_dir() and not tmp.is_symlink()
    if is_real_dir and ((tmp / IN_PROGRESS_TAG).is_file() or not any(tmp.iterdir())):
        shutil.rmtree(tmp)
        return
    raise UserError(
        f"{tmp} is in the way: hanlm writes its output there before renaming it, and it is not "
        "a leftover of hanlm's",
        fix="move or rename it, then run again",
    )


@contextlib.contextmanager
def atomic_output_dir(
    final: Path, *, marker: str = STAGE_MARKER, replace_earlier: bool = True
) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces `final` in one rename.

    `final` must be new, empty or hanlm's earlier output holding `marker` (claim_output_dir),
    checked before the work and again before the rename; the body writes `marker` into the
    temporary folder. On an exception the temporary folder is removed and `final` (if any) is
    left untouched.
    """
    final = Path(final)
    claim_output_dir(final, marker=marker, replace_earlier=replace_earlier)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.incomplete")
    _claim_temporary_dir(tmp)
    tmp.mkdir()
    (tmp / IN_PROGRESS_TAG).touch()
    try:
        yield tmp
        replace_dir(final, tmp, marker=marker, replace_earlier=replace_earlier)
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
                    self._frame = zstandard.ZstdDecompressor().decompressobj()
                out.append(self._frame.decompress(chunk))
                if self._frame.eof:  # the next frame starts in what this one left over
                    chunk = self._frame.unused_data
                    self._frame = None
                else:
                    chunk = b""
        except zstandard.ZstdError as e:
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


def lines_in_range(path: Path, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, raw line) of each line of an uncompressed file that starts in [start, end):
    cutting a file at any byte offsets gives every line to exactly one range."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line that started before the range belongs to the one before
        offset = f.tell()
        while offset < end:
            raw = f.readline()
            if not raw:
                return
            yield offset, raw
            offset += len(raw)


def strip_compression_suffix(name: str) -> str:
    lower = name.lower()
    for suffix in (".gz", ".zst"):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name
