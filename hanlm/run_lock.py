"""One command at a time on a run folder: an exclusive lock held for the whole command.

Two commands writing one run folder overwrite each other's outputs (the second `pretrain`
silently replaces the first's model; two corpus stages tear each other's parts). Every command
that writes a run folder holds `RUN/.hanlm-lock` with flock(2): the kernel releases it when the
holder dies however it dies, so a lock left by a killed command is taken over without any
guess about whether its holder still lives. The file records who holds it (PID, host, start,
command line) for the message the next command gets, and is removed as the command ends.

Under torchrun, rank 0 holds the lock for the whole launch (the other ranks of a second launch
wait in their first collective and are stopped with it). The same process may take the lock
again (the pipeline runs stages that take it themselves).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from hanlm import ranks
from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.files import (
    REPLACED_SUFFIX,
    TEMPORARY_SUFFIX,
    check_folder_path,
    recover_interrupted_commit,
)

LOCK_FILE = ".hanlm-lock"

# realpath of a held lock file -> [fd, depth]: a re-entry by the same process counts, not locks
_held: dict[str, list[int]] = {}


def _holder_record(command: str) -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
    }


def _read_holder(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "a process that has not yet said who it is"
    where = holder.get("host", "?")
    alive = ""
    if where == socket.gethostname() and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:  # gone, yet the lock is held: by processes it started
            alive = ", which has exited but left processes that still hold the lock"
        except PermissionError:
            pass
    return (
        f"`{holder.get('command', '?')}` (PID {holder.get('pid', '?')} on {where}, started "
        f"{holder.get('started', '?')}{alive})"
    )


def _open_lock_file(path: Path) -> int | None:
    """The lock file's descriptor; None where the folder cannot be written at all (a read-only
    mount): no other command can write there either, and whatever this one tries to write
    fails with its own message."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
    try:
        return os.open(path, os.O_RDONLY)  # flock works on a read-only descriptor
    except OSError:
        return None


def _is_current(fd: int, path: Path) -> bool:
    """Whether `path` still names the file `fd` locked: the holder before removes the file as
    it releases it, and a lock on a removed file would guard nothing."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _acquire(folder: Path, command: str) -> int | None:
    """The locked descriptor of the folder's lock file (None: the folder cannot be written);
    a UserError naming the holder when another command has it."""
    path = folder / LOCK_FILE
    while True:
        fd = _open_lock_file(path)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UserError(
                f"the run folder {folder} is in use by another hanlm command: {_describe(holder)}",
                fix="wait for it to finish or stop it; two commands writing one run folder "
                "would overwrite each other's outputs (use another --run folder to work side "
                "by side)",
            ) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            warn(
                f"{folder} cannot be locked on this filesystem ({e.strerror}): nothing stops a "
                "second hanlm command from writing it at the same time"
            )
            return fd
        if _is_current(fd, path):
            break
        os.close(fd)  # locked just as its holder removed it: take the file now in its place
    try:  # who holds it, for the next command's message
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_record(command)) + "\n").encode("utf-8"), 0)
    except OSError:
        pass  # a read-only descriptor: the lock holds all the same
    return fd


def _release(folder: Path, fd: int, *, remove_folder: bool) -> None:
    """Remove the lock file while still holding it (a command leaves the folder as it found
    it; the next taker checks it locked the file now at the path), then release the lock. A
    folder the command created and left empty (it refused its input) goes too."""
    with contextlib.suppress(OSError):  # a read-only mount: the file stays, harmless
        if fd >= 0:
            (folder / LOCK_FILE).unlink()
        if remove_folder and not any(folder.iterdir()):
            folder.rmdir()
    if fd >= 0:
        os.close(fd)  # closing the last descriptor releases the flock


def _recover_interrupted_commits(folder: Path) -> None:
    """The stage folders a killed command left half-committed are put back in order (files.
    recover_interrupted_commit): the earlier output restored, temporary folders removed."""
    suffixes = (TEMPORARY_SUFFIX, REPLACED_SUFFIX)
    finals = {
        entry.with_name(entry.name.removesuffix(suffix))
        for entry in folder.iterdir()
        for suffix in suffixes
        if entry.name.endswith(suffix)
    }
    for final in sorted(finals):
        try:
            for done in recover_interrupted_commit(final):
                info(f"{folder}: {done}")
        except OSError as e:  # a read-only mount: the stage that needs the folder says so
            warn(f"{final} was left half-committed and cannot be put in order now: {e}")


def _holds_for_launch() -> bool:
    """Under torchrun one process, rank 0, holds the lock for every rank of the launch."""
    return ranks.is_main()


@contextlib.contextmanager
def hold(folder: str | Path, command: str | None = None) -> Iterator[None]:
    """Hold the run folder's lock (creating the folder) until the block ends; a UserError
    naming the holder when another command has it."""
    folder = Path(folder)
    if not _holds_for_launch():
        yield
        return
    check_folder_path(folder, "the run directory (--run)")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not folder.is_dir():
            raise
    key = os.path.realpath(folder / LOCK_FILE)
    if key in _held:
        _held[key][1] += 1
    else:
        fd = _acquire(folder, command or " ".join(["hanlm", *sys.argv[1:]]))
        _held[key] = [fd if fd is not None else -1, 1]
        if fd is not None:  # no other command is committing here now: finish what one left
            _recover_interrupted_commits(folder)
    try:
        yield
    finally:
        entry = _held[key]
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            _release(folder, entry[0], remove_folder=created)
