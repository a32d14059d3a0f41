"""The checkpoint folder: its layout, which folders are committed, retention, and verification.

A checkpoint is a folder `step-NNNNNNNN/` under the run's checkpoint root: the sharded model and
optimizer state written by torch.distributed.checkpoint (hanlm.train.checkpoint), `trainer.json`
(step, tokens, loader, schedule, RNG, fingerprint) and `manifest.json` (size and BLAKE2 checksum
of every file). It is written as `step-N.incomplete/` and renamed once checked; a folder is
committed once it has its manifest, and `latest` names the newest. The manager
(hanlm.train.checkpoint_manager) and the mirror (hanlm.train.checkpoint_mirror) write them; what
reads a checkpoint folder without loading it (export, SFT, resume checks) needs this module
alone, which imports no torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from hanlm.errors import UserError
from hanlm.files import atomic_write_json, read_json

LATEST = "latest"
TRAINER_STATE = "trainer.json"
# the trainer state's seconds from a save's start to its commit: what a checkpoint costs on
# this storage (the rehearsal reads it)
WRITE_SECONDS = "write_s"
MANIFEST = "manifest.json"
INCOMPLETE = ".incomplete"


@dataclass(frozen=True)
class Policy:
    """How a run saves its checkpoints: asynchronously or not, which are kept, how failed writes
    are retried, and the mirror (a folder or an fsspec URL) they are copied to."""

    async_save: bool = True
    keep_last: int = 3
    keep_every: int = 0  # also keep every checkpoint whose step is a multiple of this
    retries: int = 3
    backoff_s: float = 1.0
    max_consecutive_failures: int = 3
    timeout_s: float = 1800.0
    mirror: str | None = None


def retained(steps: list[int], policy: Policy) -> set[int]:
    """The steps that retention keeps out of the committed `steps` (oldest first): the newest
    keep_last and every keep_every-th. The primary and the mirror both follow it."""
    keep = set(steps[-max(1, policy.keep_last) :])
    if policy.keep_every:
        keep |= {s for s in steps if s % policy.keep_every == 0}
    return keep


# -- the folders ------------------------------------------------------------------------------


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def step_of(path: Path) -> int:
    return int(path.name.split("-")[1].split(".")[0])


def step_folders(root: Path) -> list[Path]:
    """Every checkpoint folder under `root` (step-*, committed, unfinished or damaged), by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir())


def is_committed(path: Path) -> bool:
    return not path.name.endswith(INCOMPLETE) and (path / MANIFEST).is_file()


def committed(root: Path) -> list[Path]:
    """Committed checkpoint folders, oldest first."""
    return sorted((p for p in step_folders(root) if is_committed(p)), key=step_of)


def uncommitted(root: Path) -> list[Path]:
    """Checkpoint folders that cannot be trusted, by name: saves that never finished
    (step-N.incomplete) and folders without a manifest (cut short or damaged)."""
    return [p for p in step_folders(root) if not is_committed(p)]


def latest(root: Path) -> Path | None:
    """The newest committed checkpoint named by `latest` (or found on disk when it is missing)."""
    pointer = Path(root) / LATEST
    if pointer.is_file():
        path = Path(root) / pointer.read_text().strip()
        if (path / MANIFEST).is_file():
            return path
    found = committed(root)
    return found[-1] if found else None


# -- verification -----------------------------------------------------------------------------


def _checksum(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def files_of(folder: Path) -> list[Path]:
    """The files of a checkpoint folder but its manifest, by path."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def file_entry(path: Path, rank: int) -> dict:
    """A manifest's entry for `path`: its size and checksum, and the rank that wrote it."""
    return {"size": path.stat().st_size, "blake2b": _checksum(path), "rank": rank}


def write_manifest(folder: Path) -> dict:
    """A manifest of every file in `folder`, checksummed here (a checkpoint written by one process)."""
    files = {str(p.relative_to(folder)): file_entry(p, 0) for p in files_of(folder)}
    manifest = {"files": files}
    atomic_write_json(folder / MANIFEST, manifest)
    return manifest


def check_listed(folder: Path, files: dict) -> str | None:
    """None when the files on disk are exactly those listed, with the listed sizes (no reading)."""
    on_disk = {str(p.relative_to(folder)) for p in files_of(folder)}
    unlisted = sorted(on_disk - set(files))
    if unlisted:
        return f"{unlisted[0]} was written but no rank checksummed it"
    for rel, meta in files.items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != meta["size"]:
            return f"{rel} has {path.stat().st_size} bytes, expected {meta['size']}"
    return None


def verify(folder: Path) -> str | None:
    """None when every file matches the manifest, else what is wrong."""
    try:
        manifest = read_json(folder / MANIFEST)
    except (OSError, ValueError) as e:
        return f"unreadable manifest: {e}"
    for rel, meta in manifest.get("files", {}).items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != meta["size"]:
            return f"{rel} has {path.stat().st_size} bytes, expected {meta['size']}"
        if _checksum(path) != meta["blake2b"]:
            by = f" (written by rank {meta['rank']})" if "rank" in meta else ""
            return f"{rel} fails its checksum{by}"
    return None


def read_trainer_state(path: Path) -> dict:
    """A checkpoint's trainer.json: step, tokens, loader, schedule, RNG, fingerprint."""
    try:
        return read_json(Path(path) / TRAINER_STATE)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {Path(path) / TRAINER_STATE}: {e}") from None
