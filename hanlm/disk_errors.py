"""A disk that cannot take what hanlm writes (full, over quota, read-only, gone): the OSError
said as a UserError with the free space and what to do, and what was finished kept."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from hanlm.errors import UserError

STORAGE_ERRNOS = {
    errno.ENOSPC: (
        "no space left on the device",
        "free space there or put the run folder (--run) on a larger disk; what was finished is "
        "kept, and the same command continues from it",
    ),
    errno.EDQUOT: (
        "the disk quota is exhausted",
        "free space within the quota or put the run folder (--run) elsewhere; what was finished "
        "is kept, and the same command continues from it",
    ),
    errno.EROFS: (
        "the filesystem is mounted read-only",
        "put the run folder (--run) on a writable disk, or remount it read-write",
    ),
    errno.EACCES: (
        "permission denied",
        "make the folder writable for this user (chown/chmod), or choose another --run folder",
    ),
    errno.EPERM: (
        "the operation is not permitted there",
        "make the folder writable for this user, or choose another --run folder",
    ),
}


def _free_space(path: str | None) -> str:
    """'N GB free of M GB' on the filesystem that holds `path` (its nearest existing folder)."""
    if not path:
        return ""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(nbytes: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes / 1e3:,.0f} kB"


def storage_error(error: BaseException, folder: Path | None = None) -> UserError | None:
    """The UserError for a failed write anywhere in `error`'s chain of causes (no space, a
    quota, a read-only mount, no permission): what could not be written, where (the file the
    error names, else `folder`, the one the command writes), the free space and how to fix it;
    None when the chain holds no such error."""
    found: list[OSError] = []
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            found.append(error)
        error = error.__cause__ or error.__context__
    if not found:
        return None
    # a failed write() names no file; the open() or rename() before it in the chain does
    named = [e for e in found if isinstance(e.filename, str)]
    chosen = named[0] if named else found[0]
    what, fix = STORAGE_ERRNOS[chosen.errno]
    path = chosen.filename if named else (str(folder) if folder is not None else None)
    free = _free_space(path) if chosen.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return UserError(
        f"cannot write {path or 'the output'}: {what}" + (f" ({free})" if free else ""), fix=fix
    )
