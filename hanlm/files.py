"""Atomic file and folder writes, the output-path rule, crash-safe commits, and checksums.

Nothing half-written is ever read as complete: every output goes to a temporary name, is fsynced,
then renamed into place. Compressed input streams are hanlm.streams; a disk's errors as
UserErrors, hanlm.disk_errors; a stage folder's completion marker, hanlm.stages.markers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    except OSError as e:  # named by the file the caller writes, not the temporary one
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        with contextlib.suppress(OSError):  # a read-only mount: nothing was created
            tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


class DamagedFile(UserError, ValueError):
    """A JSON or JSONL file hanlm wrote that no longer parses. A ValueError too, so that a
    reader that treats an unreadable file as absent still does; elsewhere it is a UserError."""

    def __init__(self, path: Path, detail: str, line: int | None = None):
        self.path, self.detail, self.line = Path(path), detail, line
        super().__init__(
            f"the file is damaged ({detail})",
            where=f"{path}:{line}" if line else str(path),
            fix="run the stage that writes it again (`hanlm run` redoes what is damaged, or "
            "the stage's command with --force); if you edited it by hand, undo the edit",
        )

    def __reduce__(self):
        return (type(self), (self.path, self.detail, self.line))


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise DamagedFile(path, f"not valid JSON: {e.msg}", e.lineno) from None


def read_jsonl(path: Path) -> list[Any]:
    """The records of a JSONL file hanlm appends to (metrics.jsonl, samples): a last line that
    a crash cut short (no newline after it) is dropped, as if it had not been written; any
    other line that does not parse means the file is damaged (DamagedFile)."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop()  # after the last newline: b"" for a file whose last write completed
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, UnicodeDecodeError) as e:
            raise DamagedFile(path, f"line {number} is not valid JSON: {e}", number) from None
    if torn.strip():  # a complete record that only lacks its newline is kept
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            records.append(json.loads(torn))
    return records


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
        record[OUTPUT_FILES_KEY] = sorted(
            p.name for p in folder.iterdir() if p.name != IN_PROGRESS_TAG
        )
        atomic_write_json(folder / marker, record)


# --- committing a folder: crash-safe at every instant ------------------------------------------
#
# A new output is built in `NAME.incomplete/` (tagged IN_PROGRESS_TAG until it is complete, then
# holding its marker), and swapped with `NAME` in one atomic exchange (renameat2); where the
# filesystem cannot exchange, the earlier output is first moved to `NAME.replaced/`. A kill at
# any instant therefore leaves `NAME` holding the earlier output or the new one, or (on the
# fallback path, between its two renames) `NAME.replaced/` holding the earlier one, which
# recover_interrupted_commit moves back. Every name hanlm leaves behind is recognisable as its
# own: the in-progress tag, hanlm's marker, or nothing at all.

TEMPORARY_SUFFIX = ".incomplete"  # the new output while it is written
REPLACED_SUFFIX = ".replaced"  # the earlier output while the new one moves in (fallback path)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)  # glibc 2.28+; None elsewhere


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the
    libc or the filesystem cannot, so the caller falls back to two renames."""
    if _renameat2 is None:
        return False
    done = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False  # not supported here (e.g. NFS, some FUSE filesystems)
    raise OSError(err, os.strerror(err), str(b))


def commit_target(final: Path) -> Path:
    """Where `final`'s content really lives: a symlinked output folder (one moved to another
    disk and linked back) is replaced where it points to, so the link stays."""
    final = Path(final)
    return final.resolve() if final.is_symlink() and final.is_dir() else final


def temporary_dir(final: Path) -> Path:
    return final.with_name(final.name + TEMPORARY_SUFFIX)


def replaced_dir(final: Path) -> Path:
    return final.with_name(final.name + REPLACED_SUFFIX)


def is_hanlm_leftover(path: Path, marker: str = STAGE_MARKER) -> bool:
    """A real folder that only hanlm leaves at a temporary name: tagged in progress, holding
    hanlm's marker (complete, or an earlier output moved aside), or empty."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    if (path / IN_PROGRESS_TAG).is_file() or _hanlm_marker(path / marker) is not None:
        return True
    return not any(path.iterdir())


def _in_the_way(path: Path) -> UserError:
    return UserError(
        f"{path} is in the way: hanlm writes its output there while committing it, and it is "
        "not a leftover of hanlm's",
        fix="move or rename it, then run again",
    )


def recover_interrupted_commit(final: Path, *, marker: str = STAGE_MARKER) -> list[str]:
    """Finish what a commit of `final` killed part-way left behind: an earlier output moved
    aside comes back when nothing took its place, hanlm's temporary folders are removed.
    What was done, in words (empty when there was nothing to do). Anything at those names that
    is not hanlm's is left alone (the next commit refuses it)."""
    target = commit_target(final)
    done = []
    replaced = replaced_dir(target)
    if is_hanlm_leftover(replaced, marker):
        if os.path.lexists(target):
            shutil.rmtree(replaced)
            done.append(f"removed {replaced.name}, an earlier output already replaced")
        else:
            os.replace(replaced, target)
            fsync_dir(target.parent)
            done.append(f"restored {target.name} from {replaced.name}")
    tmp = temporary_dir(target)
    if is_hanlm_leftover(tmp, marker):
        shutil.rmtree(tmp)
        done.append(f"removed {tmp.name}, left by an interrupted run")
    return done


def replace_dir(
    final: Path, tmp: Path, *, marker: str = STAGE_MARKER, replace_earlier: bool = True
) -> None:
    """Fsync everything in `tmp`, then put it in place of `final` (see claim_output_dir) so
    that a kill at any instant leaves the earlier output or the new one (see above)."""
    final, tmp = commit_target(final), Path(tmp)
    claim_output_dir(final, marker=marker, replace_earlier=replace_earlier)
    _record_output_files(tmp, marker)
    _fsync_tree(tmp)
    (tmp / IN_PROGRESS_TAG).unlink(missing_ok=True)  # from here on, its marker says it is ours
    fsync_dir(tmp)
    if os.path.lexists(final):
        if _exchange(tmp, final):
            fsync_dir(final.parent)
            shutil.rmtree(tmp)  # the earlier output, now at the temporary name
            return
        replaced = replaced_dir(final)
        if os.path.lexists(replaced):
            if not is_hanlm_leftover(replaced, marker):
                raise _in_the_way(replaced)
            shutil.rmtree(replaced)
        os.replace(final, replaced)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        shutil.rmtree(replaced)
        return
    os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def atomic_output_dir(
    final: Path, *, marker: str = STAGE_MARKER, replace_earlier: bool = True
) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces `final` atomically.

    `final` must be new, empty or hanlm's earlier output holding `marker` (claim_output_dir),
    checked before the work and again before the swap; the body writes `marker` into the
    temporary folder. On an exception the temporary folder is removed and `final` (if any) is
    left untouched. What an earlier run's interrupted commit left is recovered first.
    """
    final = commit_target(final)
    recover_interrupted_commit(final, marker=marker)
    claim_output_dir(final, marker=marker, replace_earlier=replace_earlier)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_dir(final)
    for path in (tmp, replaced_dir(final)):
        if os.path.lexists(path):
            raise _in_the_way(path)
    tmp.mkdir()
    (tmp / IN_PROGRESS_TAG).touch()
    try:
        yield tmp
        replace_dir(final, tmp, marker=marker, replace_earlier=replace_earlier)
    except BaseException:
        if os.path.lexists(tmp) and is_hanlm_leftover(tmp, marker):
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (configs, upstream fingerprints)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict:
    """What a finished file is: its size and sha256, recorded so that a later run can check it
    before reusing the file."""
    return {"size": Path(path).stat().st_size, "sha256": file_sha256(path)}


def file_mismatch(path: Path, record: dict, *, checksum: bool = True) -> str | None:
    """None when `path` has the size and (with `checksum`) the sha256 that `record` holds, else
    what is wrong with it. What the record lacks is not checked."""
    path = Path(path)
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    if "size" in record and size != record["size"]:
        return f"{path.name} has {size:,} bytes, {record['size']:,} were written"
    if checksum and "sha256" in record and file_sha256(path) != record["sha256"]:
        return f"{path.name} fails its sha256 checksum"
    return None


VERIFY_THREADS = 8  # hashlib releases the GIL on large blocks: files hash side by side


def damaged_files(folder: Path, records: list[dict]) -> list[str]:
    """What is wrong with the files a finished output recorded (`path` relative to `folder`,
    `size`, `sha256`), or an empty list: every reused output is checked in full, sizes first
    (cheap, and a missing or truncated file needs no hashing), then checksums on several
    threads. benchmarks/verify_on_skip.py measures what this costs."""
    folder = Path(folder)
    sized = [(r, file_mismatch(folder / r["path"], r, checksum=False)) for r in records]
    problems = [problem for _, problem in sized if problem]
    if problems:
        return problems
    with concurrent.futures.ThreadPoolExecutor(min(VERIFY_THREADS, len(records) or 1)) as pool:
        checked = pool.map(lambda r: file_mismatch(folder / r["path"], r), records)
        return [problem for problem in checked if problem]
