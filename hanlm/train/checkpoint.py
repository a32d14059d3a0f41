"""Checkpoints that survive crashes, preemption and bad storage.

A checkpoint is a folder `step-NNNNNNNN/`: the sharded model and optimizer state written by
torch.distributed.checkpoint (each rank its own shards), `trainer.json` (step, tokens, loader,
schedule, RNG, fingerprint) and `manifest.json` (size and BLAKE2 checksum of every file). It is
written as `step-N.incomplete/`, checked, fsynced and renamed; only then does `latest` move, and
only then are old checkpoints pruned. Loading verifies the manifest and falls back to the previous
committed checkpoint (or the mirror) when a folder is damaged.

Each rank reads back and checksums the files it wrote, in the thread that wrote them (DCP's save
thread when the save is asynchronous); at the commit the checksums are gathered and rank 0 writes
the manifest, so no rank reads the whole checkpoint on the training thread. Under DDP every rank
holds the same state: rank 0 alone stages (copies) and writes it, instead of every rank staging a
full copy of which DCP then writes only a part.

Saves are asynchronous by default (`dcp.async_save` over a gloo group): the state is staged into
host memory before the call returns, so the next optimizer step cannot change what is written,
and at most one save is in flight. A failed write (no space, I/O error, permission, timeout) is
retried with backoff and reported; training goes on and stops cleanly after too many failures
in a row. Test hooks: HANLM_FAULT_WRITE_DELAY_S slows every file write (a slow disk) and
HANLM_FAULT_WRITE_ERRORS=errno:count fails the next `count` writes with that errno.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import os
import shutil
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, atomic_write_text, fsync_dir, read_json
from hanlm.train.parallel import Dist, barrier

LATEST = "latest"
TRAINER_STATE = "trainer.json"
MANIFEST = "manifest.json"
INCOMPLETE = ".incomplete"


class CheckpointError(UserError):
    """Checkpoints kept failing: training stopped cleanly, the last good checkpoint is intact."""


@dataclass(frozen=True)
class Policy:
    async_save: bool = True
    keep_last: int = 3
    keep_every: int = 0  # also keep every checkpoint whose step is a multiple of this
    retries: int = 3
    backoff_s: float = 1.0
    max_consecutive_failures: int = 3
    timeout_s: float = 1800.0
    mirror: str | None = None


# Below this much free space a failed write is taken for a full disk: a write that runs out of
# space fills it first, and the unfinished folder still holds that space when the error is read.
_NEARLY_FULL_BYTES = 64 << 20


def _describe(error: BaseException) -> str:
    """One line: DCP wraps a rank's OSError, with its remote traceback, in CheckpointException."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _errors_within(error: BaseException) -> list[BaseException]:
    """`error`, the ranks' errors a CheckpointException wraps, and what each was raised from
    or while handling (torch's writer reports a full disk as "unexpected pos 704 vs 598",
    raised while handling the OSError)."""
    found: list[BaseException] = []
    pending = [error]
    while pending:
        current = pending.pop()
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        if isinstance(current, CheckpointException):
            pending.extend(failure[0] for failure in current.failures.values())
        pending.extend((current.__cause__, current.__context__))
    return found


def _explain(error: BaseException, folder: Path) -> str:
    """One line saying why a save failed: a full disk said as such, with its free space, even
    where torch reports it as its serializer's position mismatch. Call it before the unfinished
    folder is removed, while the space it took is still in use."""
    errors = _errors_within(error)
    full = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in errors)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if not full and free is not None and free < _NEARLY_FULL_BYTES:
        # torch's serializer error may come from a rank whose OSError did not travel with it
        full = any("unexpected pos" in str(e) for e in errors)
    if full:
        space = f" ({free / 1e9:.2f} GB free)" if free is not None else ""
        return f"no space left on device at {folder}{space}"
    return _describe(error)


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def _step_of(path: Path) -> int:
    return int(path.name.split("-")[1].split(".")[0])


def _step_folders(root: Path) -> list[Path]:
    """Every checkpoint folder under `root` (step-*, committed, unfinished or damaged), by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir())


def _is_committed(path: Path) -> bool:
    return not path.name.endswith(INCOMPLETE) and (path / MANIFEST).is_file()


def committed(root: Path) -> list[Path]:
    """Committed checkpoint folders, oldest first."""
    return sorted((p for p in _step_folders(root) if _is_committed(p)), key=_step_of)


def uncommitted(root: Path) -> list[Path]:
    """Checkpoint folders that cannot be trusted, by name: saves that never finished
    (step-N.incomplete) and folders without a manifest (cut short or damaged)."""
    return [p for p in _step_folders(root) if not _is_committed(p)]


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


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _file_entry(path: Path, rank: int) -> dict:
    return {"size": path.stat().st_size, "blake2b": _checksum(path), "rank": rank}


def write_manifest(folder: Path) -> dict:
    """A manifest of every file in `folder`, checksummed here (a checkpoint written by one process)."""
    files = {str(p.relative_to(folder)): _file_entry(p, 0) for p in _files(folder)}
    manifest = {"files": files}
    atomic_write_json(folder / MANIFEST, manifest)
    return manifest


def _check_listed(folder: Path, files: dict) -> str | None:
    """None when the files on disk are exactly those listed, with the listed sizes (no reading)."""
    on_disk = {str(p.relative_to(folder)) for p in _files(folder)}
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


# -- fault injection (tests and benchmarks) ----------------------------------------------------


class _ChecksummingWriter(FileSystemWriter):
    """FileSystemWriter that reads back and checksums the files this rank wrote, in the thread
    that wrote them; `checksums` holds them for the current save ({relative path: entry})."""

    def reset(self, checkpoint_id=None) -> None:
        super().reset(checkpoint_id)
        self.checksums: dict[str, dict] = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self._my_rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        written.wait()  # the files are written and fsynced when it returns
        # Every file with this rank's prefix, even one that holds no tensor.
        for path in sorted(Path(self.path).glob(f"{plan.storage_data.prefix}*")):
            self.checksums[path.name] = _file_entry(path, self._my_rank)
        return written

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)  # the coordinator writes DCP's .metadata
        for path in Path(self.path).glob("*.metadata"):
            self.checksums[path.name] = _file_entry(path, self._my_rank)


class _FaultyWriter(_ChecksummingWriter):
    """A FileSystemWriter that can be slowed down or made to fail, through environment variables."""

    _lock = threading.Lock()

    def write_data(self, plan, planner):
        delay = float(os.environ.get("HANLM_FAULT_WRITE_DELAY_S", "0") or 0)
        if delay:
            time.sleep(delay)
        _maybe_fail()
        return super().write_data(plan, planner)


def _maybe_fail() -> None:
    spec = os.environ.get("HANLM_FAULT_WRITE_ERRORS", "")
    if not spec:
        return
    with _FaultyWriter._lock:
        name, count = spec.split(":")
        if int(count) <= 0:
            return
        os.environ["HANLM_FAULT_WRITE_ERRORS"] = f"{name}:{int(count) - 1}"
    code = getattr(errno, name.upper())
    raise OSError(code, os.strerror(code))


def _writer(path: Path) -> _ChecksummingWriter:
    faulty = os.environ.get("HANLM_FAULT_WRITE_DELAY_S") or os.environ.get(
        "HANLM_FAULT_WRITE_ERRORS"
    )
    cls = _FaultyWriter if faulty else _ChecksummingWriter
    return cls(str(path), sync_files=True)


# The async writer thread warns again, outside any catch_warnings block: filter it for good.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")


@contextlib.contextmanager
def _single_process_ok():
    # DCP warns that it "assumes" a single process when there is no process group: we mean it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# -- the manager -------------------------------------------------------------------------------


@dataclass
class _InFlight:
    step: int
    tmp: Path
    future: concurrent.futures.Future
    trainer_state: dict
    started: float


class CheckpointManager:
    """Saves, commits, prunes, mirrors and loads the checkpoints of one training run."""

    def __init__(self, root: Path, dist: Dist, policy: Policy):
        self.root, self.dist, self.policy = Path(root), dist, policy
        self.failures = 0
        self.retry_due: float | None = None
        self._in_flight: _InFlight | None = None
        self._mirror_thread: threading.Thread | None = None
        self._storage = _writer(self.root)
        # Async saves coordinate over gloo so NCCL streams stay free for training.
        # DCP's background save thread runs collectives on its own gloo group; the main thread's
        # per-step flags and commits use another, so the two never interleave on one group.
        self.save_group = torch_dist.new_group(backend="gloo") if dist.distributed else None
        self.group = torch_dist.new_group(backend="gloo") if dist.distributed else None
        if dist.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in self.root.glob(f"step-*{INCOMPLETE}"):
                shutil.rmtree(leftover, ignore_errors=True)  # an interrupted save
        barrier(dist)

    # -- saving ------------------------------------------------------------------------------

    def save(
        self, step: int, model, optimizer, trainer_state: dict, *, sync: bool = False
    ) -> float:
        """Start (or, when sync, complete) a checkpoint of `step`. Returns seconds blocked."""
        started = time.perf_counter()
        self.wait()  # at most one save in flight
        tmp = step_dir(self.root, step).with_name(step_dir(self.root, step).name + INCOMPLETE)
        for attempt in range(self.policy.retries + 1):
            try:
                self._prepare(tmp)
                model_sd, optim_sd = get_state_dict(model, optimizer)
                state = {"model": model_sd, "optim": optim_sd}
                # DDP: every rank holds this same state; rank 0 alone stages and writes it.
                alone = self.dist.distributed and not _is_sharded(state)
                writes = self.dist.is_main or not alone
                with _single_process_ok():
                    if self.policy.async_save and not sync:
                        if writes:
                            future = dcp.async_save(
                                state,
                                checkpoint_id=str(tmp),
                                storage_writer=self._storage,
                                process_group=self.save_group,
                                no_dist=alone,
                            )
                        else:
                            future = concurrent.futures.Future()
                            future.set_result(None)
                            self._storage.reset(str(tmp))  # nothing written here
                        self._in_flight = _InFlight(step, tmp, future, trainer_state, started)
                        return time.perf_counter() - started
                    error = None
                    try:
                        if writes:
                            dcp.save(
                                state,
                                checkpoint_id=str(tmp),
                                storage_writer=self._storage,
                                process_group=self.group,
                                no_dist=alone,
                            )
                        else:
                            self._storage.reset(str(tmp))
                    except (OSError, CheckpointException) as e:
                        error = e
                    if alone:  # only rank 0 wrote: the others learn its outcome
                        self._raise_on_every_rank(error)
                    elif error is not None:
                        raise error
                self._commit_all_ranks(step, tmp, trainer_state, ok=True)
                return time.perf_counter() - started
            except (OSError, CheckpointException) as e:  # DCP wraps a rank's write error
                reason = _explain(e, self.root)  # before the cleanup frees the space it took
                self._commit_all_ranks(step, tmp, trainer_state, ok=False, quiet=True)
                if attempt < self.policy.retries:
                    delay = self.policy.backoff_s * 2**attempt
                    warn(f"checkpoint step {step}: {reason}; retrying in {delay:.1f}s")
                    time.sleep(delay)
                else:
                    self._failed(step, reason)
        return time.perf_counter() - started

    def _prepare(self, tmp: Path) -> None:
        """A fresh temporary folder, or the same OSError on every rank."""
        error = None
        if self.dist.is_main:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            except OSError as e:
                error = e
        self._raise_on_every_rank(error)

    def _raise_on_every_rank(self, error: BaseException | None) -> None:
        """Rank 0's error (None: none) raised on every rank: an OSError with its errno elsewhere."""
        code = 0.0
        if error is not None:
            code = float(getattr(error, "errno", None) or errno.EIO)
        failed = torch.tensor([code])
        if self.dist.distributed:
            torch_dist.broadcast(failed, src=0, group=self.group)
        if failed.item():
            code = int(failed.item())
            raise error or OSError(code, os.strerror(code))

    def local_flags(self) -> tuple[float, float]:
        """(a save is in flight and not yet written here, a retry is due here), for the loop's
        one per-step all-reduce."""
        pending = self._in_flight is not None and not self._in_flight.future.done()
        retry = self.retry_due is not None and time.monotonic() >= self.retry_due
        return float(pending), float(retry)

    @property
    def in_flight_step(self) -> int | None:
        """The step of the save in flight, None when there is none."""
        return self._in_flight.step if self._in_flight is not None else None

    def finish_if_written(self, any_pending: bool) -> None:
        """Commit the save in flight once every rank has written it (`any_pending` is agreed)."""
        if self._in_flight is not None and not any_pending:
            self._finish()

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and committed."""
        if self._in_flight is not None:
            self._finish()

    def _finish(self) -> None:
        job, self._in_flight = self._in_flight, None
        error: BaseException | None = None
        try:
            job.future.result(timeout=self.policy.timeout_s)
        except concurrent.futures.TimeoutError:
            error = OSError(
                errno.ETIMEDOUT, f"write did not finish in {self.policy.timeout_s:.0f}s"
            )
        except (Exception, CheckpointException) as e:  # DCP's exception is a BaseException
            error = e
        reason = _explain(error, self.root) if error is not None else None  # before the cleanup
        self._commit_all_ranks(job.step, job.tmp, job.trainer_state, ok=error is None, quiet=True)
        if reason is not None:
            self._failed(job.step, reason)
            self.retry_due = time.monotonic() + self.policy.backoff_s

    def _commit_all_ranks(
        self, step: int, tmp: Path, trainer_state: dict, *, ok: bool, quiet=False
    ):
        flag = torch.tensor([1.0 if ok else 0.0])
        if self.dist.distributed:
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN, group=self.group)
        error: OSError | None = None  # rank 0's, when the commit itself failed
        if flag.item() == 1.0:
            files = self._gather_checksums()
            if self.dist.is_main:
                try:
                    self._commit(step, tmp, trainer_state, files)
                except OSError as e:
                    error = e
            failed = torch.tensor([0.0 if error is None else 1.0])
            if self.dist.distributed:
                torch_dist.broadcast(failed, src=0, group=self.group)
            if failed.item() == 0.0:
                self.failures, self.retry_due = 0, None
                return
            ok = False
        reason = _explain(error, self.root) if error is not None else None
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if not quiet:
            self._failed(step, reason or "a rank failed to write its shards")

    def _gather_checksums(self) -> dict[str, dict]:
        """On rank 0: the checksums every rank took of the files it wrote ({} elsewhere)."""
        mine = dict(getattr(self._storage, "checksums", {}))  # none before a save began here
        if not self.dist.distributed:
            return mine
        every: list | None = [None] * self.dist.world_size if self.dist.is_main else None
        torch_dist.gather_object(mine, every, dst=0, group=self.group)
        return {rel: entry for part in every or [] for rel, entry in part.items()}

    def _commit(self, step: int, tmp: Path, trainer_state: dict, files: dict[str, dict]) -> None:
        atomic_write_json(tmp / TRAINER_STATE, trainer_state)
        files = {**files, TRAINER_STATE: _file_entry(tmp / TRAINER_STATE, self.dist.rank)}
        problem = _check_listed(tmp, files)
        if problem:
            raise OSError(errno.EIO, f"read-back check failed: {problem}")
        atomic_write_json(tmp / MANIFEST, {"files": dict(sorted(files.items()))})
        final = step_dir(self.root, step)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(self.root)
        atomic_write_text(self.root / LATEST, final.name + "\n")
        self._mirror(final)  # joins the previous copy first, so pruning never races it
        self._prune()

    def _failed(self, step: int, error: str) -> None:
        """Count a failed save (`error`: why, one line) and stop after too many in a row."""
        self.failures += 1
        warn(
            f"checkpoint of step {step} failed ({error}); "
            f"{self.failures} in a row; the last good one is {latest(self.root)}"
        )
        if self.failures >= self.policy.max_consecutive_failures:
            raise CheckpointError(
                f"{self.failures} checkpoints in a row could not be written to {self.root} "
                f"(last: {error})",
                fix="free space or fix the disk, then rerun the same command: it resumes from "
                f"{latest(self.root) or 'the start'}",
            )

    # -- retention and mirror -----------------------------------------------------------------

    def _prune(self) -> None:
        found = committed(self.root)
        keep = retained([_step_of(p) for p in found], self.policy)
        for path in found:
            if _step_of(path) not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def _mirror(self, folder: Path) -> None:
        if not self.policy.mirror:
            return
        if self._mirror_thread is not None:
            self._mirror_thread.join()  # one copy at a time, in order
        self._mirror_thread = threading.Thread(
            target=_copy_to_mirror, args=(folder, self.policy), daemon=True
        )
        self._mirror_thread.start()

    def close(self) -> None:
        self.wait()
        if self._mirror_thread is not None:
            self._mirror_thread.join()

    def abandon(self) -> None:
        """On an error: forget the save in flight without collectives (other ranks may be gone);
        its .incomplete folder is cleaned up at the next start."""
        self._in_flight = None

    # -- loading -------------------------------------------------------------------------------

    def load_latest(self, model, optimizer) -> dict | None:
        """Load the newest verified checkpoint (restoring from the mirror when the primary is
        gone); None when there is none."""
        if self.dist.is_main and not committed(self.root) and self.policy.mirror:
            _restore_from_mirror(self.policy.mirror, self.root)
        barrier(self.dist)
        for path in reversed(committed(self.root)):
            problem = verify(path) if self.dist.is_main else None
            bad = torch.tensor([1.0 if problem else 0.0])
            if self.dist.distributed:
                torch_dist.broadcast(bad, src=0, group=self.group)
            if bad.item():
                warn(f"skipping damaged checkpoint {path}: {problem}")
                continue
            state = load(path, model, optimizer, group=self.group)
            if self.dist.is_main:
                info(f"resumed from {path}")
            return state
        return None


def retained(steps: list[int], policy: Policy) -> set[int]:
    """The steps that retention keeps out of the committed `steps` (oldest first): the newest
    keep_last and every keep_every-th. The primary and the mirror both follow it."""
    keep = set(steps[-max(1, policy.keep_last) :])
    if policy.keep_every:
        keep |= {s for s in steps if s % policy.keep_every == 0}
    return keep


def _is_sharded(state: dict) -> bool:
    """Whether any tensor of a (nested) state dict is a DTensor, i.e. split over ranks (FSDP)."""
    from torch.distributed.tensor import DTensor  # deferred: as torch.distributed.checkpoint

    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(_is_sharded(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(_is_sharded(v) for v in state)
    return False


def read_trainer_state(path: Path) -> dict:
    try:
        return read_json(Path(path) / TRAINER_STATE)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {Path(path) / TRAINER_STATE}: {e}") from None


def load(path: Path, model, optimizer, group=None) -> dict:
    """Load model and optimizer state in place (any number of ranks: DCP reshards)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(path), process_group=group)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return read_json(Path(path) / TRAINER_STATE)


# -- mirror --------------------------------------------------------------------------------------
#
# The mirror holds committed checkpoints under the same names and the same `latest` pointer as
# the primary, pruned by the same retention. A folder is committed there too once its manifest
# is in it: a local mirror gets the folder by rename, a remote one (an fsspec URL) file by file
# with the manifest last, so a copy cut short is never taken for a checkpoint.


def _fs(url: str):
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
    files = [*_files(folder), folder / MANIFEST]  # the manifest last: it commits the copy
    for parent in sorted({str(p.parent.relative_to(folder)) for p in files}):
        fs.makedirs(target if parent == "." else f"{target}/{parent}", exist_ok=True)
    for path in files:
        fs.put_file(str(path), f"{target}/{path.relative_to(folder).as_posix()}")


def _mirror_steps(fs, base: str) -> dict[str, bool]:
    """Folder name -> committed (has its manifest) for every step folder in the mirror."""
    if fs is None:
        return {p.name: _is_committed(p) for p in _step_folders(Path(base))}
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
    done = sorted((_step_of(Path(n)) for n, ok in steps.items() if ok))
    keep = retained(done, policy)
    for name, ok in steps.items():
        if ok and _step_of(Path(name)) in keep:
            continue
        if fs is None:
            shutil.rmtree(Path(base) / name, ignore_errors=True)
        else:
            fs.rm(f"{base}/{name}", recursive=True)


def _copy_to_mirror(folder: Path, policy: Policy) -> None:
    for attempt in range(policy.retries + 1):
        try:
            fs, base = _fs(policy.mirror)
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
    done = sorted((n for n, ok in steps.items() if ok), key=lambda n: _step_of(Path(n)))
    return done[-1] if done else None


def _restore_from_mirror(mirror: str, root: Path) -> None:
    """Copy the mirror's newest committed checkpoint into `root` (verified, then renamed)."""
    fs, base = _fs(mirror)
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
    if problem:
        warn(f"the mirror's {name} is damaged ({problem}); not restored")
        shutil.rmtree(tmp, ignore_errors=True)
        return
    shutil.rmtree(root / name, ignore_errors=True)  # an uncommitted folder of that name
    os.replace(tmp, root / name)
    atomic_write_text(root / LATEST, name + "\n")
    info(f"restored checkpoint {name} from the mirror {mirror}")


def rng_state() -> dict:
    return {"torch": torch.get_rng_state().tolist()}


def set_rng_state(state: dict) -> None:
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
