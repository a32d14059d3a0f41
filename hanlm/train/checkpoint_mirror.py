"""The checkpoint mirror: committed checkpoints copied to a second place, and restored from it.

`[checkpoint] mirror` is one folder (or URL) for every training of every run; each training
keeps its copies in a folder of its own there (`place`: `RUN/pretrain`, `RUN/sft`,
`RUN/compare/drop/pretrain`), so that one restores, and one retention prunes, only its own.
That folder holds committed checkpoints under the same names and the same `latest` pointer as
the primary, pruned by the same retention. A folder is committed there too once its manifest
is in it: a local mirror gets the folder by rename, a remote one (an fsspec URL) file by file
with the manifest last, so a copy cut short is never taken for a checkpoint. The manager
(hanlm.train.checkpoint_manager) copies each committed checkpoint in a thread, and restores the
newest when the primary has none.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from hanlm.console import info, warn
from hanlm.files import atomic_write_text
from hanlm.train.checkpoint_layout import (
    INCOMPLETE,
    LATEST,
    MANIFEST,
    Policy,
    files_of,
    is_committed,
    read_trainer_state,
    retained,
    step_folders,
    step_of,
    verify,
)


def place(mirror: str, where: str) -> str:
    """The folder (or URL) under `mirror` that holds the checkpoints of the training `where`."""
    if "://" in mirror:
        return f"{mirror.rstrip('/')}/{where}"
    return str(Path(mirror) / where)


def file_system(url: str):
    """(fsspec file system, base path) for a URL; (None, path) for a local folder."""
    if "://" in url:
        import fsspec  # deferred: optional, needed only by a remote mirror

        fs, base = fsspec.core.url_to_fs(url)
        return fs, base.rstrip("/")
    return None, str(Path(url))


def _remote_files(fs, folder: str) -> dict[str, str]:
    """Relative path -> remote path of every file under `folder` on `fs`."""
    prefix = folder.rstrip("/") + "/"
    return {p[len(prefix) :]: p for p in fs.find(folder) if p.startswith(prefix)}


def _put_files(fs, folder: Path, target: str) -> None:
    """Copy the files of `folder` to `target` one by one, named explicitly: fsspec's recursive
    put copies a folder *into* a target that already exists (URL/step-N/step-N)."""
    files = [*files_of(folder), folder / MANIFEST]  # the manifest last: it commits the copy
    for parent in sorted({str(p.parent.relative_to(folder)) for p in files}):
        fs.makedirs(target if parent == "." else f"{target}/{parent}", exist_ok=True)
    for path in files:
        fs.put_file(str(path), f"{target}/{path.relative_to(folder).as_posix()}")


def _mirror_steps(fs, base: str) -> dict[str, bool]:
    """Folder name -> committed (has its manifest) for every step folder in the mirror."""
    if fs is None:
        return {p.name: is_committed(p) for p in step_folders(Path(base))}
    if not fs.exists(base):
        return {}
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
    return {
        name: not name.endswith(INCOMPLETE) and fs.exists(f"{base}/{name}/{MANIFEST}")
        for name in names
        if name.startswith("step-")
    }


def _prune_mirror(fs, base: str, policy: Policy) -> None:
    """Apply the primary's retention to the mirror; drop copies that never finished."""
    steps = _mirror_steps(fs, base)
    done = sorted((step_of(Path(n)) for n, ok in steps.items() if ok))
    keep = retained(done, policy)
    for name, ok in steps.items():
        if ok and step_of(Path(name)) in keep:
            continue
        if fs is None:
            shutil.rmtree(Path(base) / name, ignore_errors=True)
        else:
            fs.rm(f"{base}/{name}", recursive=True)


def copy(folder: Path, policy: Policy) -> None:
    """Copy the committed `folder` to the policy's mirror, point the mirror's `latest` at it and
    prune the mirror; a failure is reported and retried, never raised: the mirror is best effort."""
    for attempt in range(policy.retries + 1):
        try:
            fs, base = file_system(policy.mirror)
            target = f"{base}/{folder.name}"
            if fs is None:
                tmp = Path(target + INCOMPLETE)
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(folder, tmp)
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
                atomic_write_text(Path(base) / LATEST, folder.name + "\n")
            else:
                if fs.exists(target):  # an earlier copy of this step, maybe cut short
                    fs.rm(target, recursive=True)
                _put_files(fs, folder, target)
                fs.pipe(f"{base}/{LATEST}", (folder.name + "\n").encode())
            _prune_mirror(fs, base, policy)
            return
        except Exception as e:  # a mirror is best effort: report and keep training
            warn(f"mirror copy of {folder.name} to {policy.mirror} failed ({e})")
            time.sleep(policy.backoff_s * 2**attempt)


def remove(where: str) -> None:
    """Delete the folder (or URL) `where` under a mirror and what it holds; best effort: a
    mirror that cannot be reached now is left as it is."""
    try:
        fs, base = file_system(where)
        if fs is None:
            shutil.rmtree(base, ignore_errors=True)
        elif fs.exists(base):
            fs.rm(base, recursive=True)
    except OSError as e:
        warn(f"cannot clear {where} in the mirror ({e})")


def mirror_latest(mirror: str) -> str | None:
    """The name of the newest committed checkpoint in the mirror folder (or URL) `mirror`."""
    try:
        return _mirror_latest(*file_system(mirror))
    except OSError:
        return None


def _mirror_latest(fs, base: str) -> str | None:
    """The committed folder the mirror's `latest` names, else its newest committed one."""
    steps = _mirror_steps(fs, base)
    try:
        if fs is None:
            name = (Path(base) / LATEST).read_text().strip()
        else:
            name = fs.cat(f"{base}/{LATEST}").decode().strip()
        if steps.get(name):
            return name
    except (OSError, FileNotFoundError, UnicodeDecodeError):
        pass
    done = sorted((n for n, ok in steps.items() if ok), key=lambda n: step_of(Path(n)))
    return done[-1] if done else None


def restore(mirror: str, root: Path, fingerprint: str | None = None) -> None:
    """Copy the mirror's newest committed checkpoint into `root` (verified, then renamed); one
    whose trainer state holds another `fingerprint` (another model, data or seed that wrote
    to the same place) is left where it is."""
    fs, base = file_system(mirror)
    try:
        name = _mirror_latest(fs, base)
        if name is None:
            return
        tmp = root / (name + INCOMPLETE)
        shutil.rmtree(tmp, ignore_errors=True)
        if fs is None:
            shutil.copytree(Path(base) / name, tmp)
        else:
            for rel, remote in _remote_files(fs, f"{base}/{name}").items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(tmp / rel))
    except OSError as e:
        warn(f"cannot restore from the mirror {mirror} ({e})")
        return
    problem = verify(tmp)
    if (
        problem is None
        and fingerprint is not None
        and read_trainer_state(tmp).get("fingerprint") != fingerprint
    ):
        problem = "made by another model, data or seed"
    if problem:
        warn(f"the mirror's {name} in {mirror} is not restored: {problem}")
        shutil.rmtree(tmp, ignore_errors=True)
        return
    shutil.rmtree(root / name, ignore_errors=True)  # an uncommitted folder of that name
    os.replace(tmp, root / name)
    atomic_write_text(root / LATEST, name + "\n")
    info(f"restored checkpoint {name} from the mirror {mirror}")
