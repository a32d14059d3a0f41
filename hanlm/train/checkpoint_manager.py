"""The checkpoints of one training run: when they are saved, committed, retried, kept, loaded.

A checkpoint (hanlm.train.checkpoint_layout) is written as `step-N.incomplete/` through DCP
(hanlm.train.checkpoint), checked, fsynced and renamed; only then does `latest` move, and only
then are old checkpoints pruned (keep_last, keep_every) and the new one copied to the mirror
(hanlm.train.checkpoint_mirror). Loading verifies the manifest and falls back to the previous
committed checkpoint (or the mirror) when a folder is damaged.

Saves are asynchronous by default (`dcp.async_save` over a gloo group): the state is staged into
host memory before the call returns, so the next optimizer step cannot change what is written,
and at most one save is in flight. A failed write (no space, I/O error, permission, timeout) is
retried with backoff and reported; training goes on and stops cleanly after too many failures
in a row.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch.distributed.checkpoint.api import CheckpointException

from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, atomic_write_text, fsync_dir
from hanlm.train import checkpoint, checkpoint_mirror
from hanlm.train.checkpoint_layout import (
    INCOMPLETE,
    LATEST,
    MANIFEST,
    TRAINER_STATE,
    WRITE_SECONDS,
    Policy,
    check_listed,
    committed,
    file_entry,
    latest,
    retained,
    step_dir,
    step_of,
    verify,
)
from hanlm.train.parallel import Dist, barrier


class CheckpointError(UserError):
    """Checkpoints kept failing: training stopped cleanly, the last good checkpoint is intact."""


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
        self._storage = checkpoint.writer(self.root)
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
                state = checkpoint.state_dict(model, optimizer)
                # DDP: every rank holds this same state; rank 0 alone stages and writes it.
                alone = self.dist.distributed and not checkpoint.is_sharded(state)
                writes = self.dist.is_main or not alone
                if self.policy.async_save and not sync:
                    if writes:
                        future = checkpoint.save_async(
                            state, tmp, self._storage, group=self.save_group, alone=alone
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
                        checkpoint.save(state, tmp, self._storage, group=self.group, alone=alone)
                    else:
                        self._storage.reset(str(tmp))
                except (OSError, CheckpointException) as e:
                    error = e
                if alone:  # only rank 0 wrote: the others learn its outcome
                    self._raise_on_every_rank(error)
                elif error is not None:
                    raise error
                self._commit_all_ranks(step, tmp, trainer_state, ok=True, started=started)
                return time.perf_counter() - started
            except (OSError, CheckpointException) as e:  # DCP wraps a rank's write error
                # explained before the cleanup frees the space it took
                reason = checkpoint.explain(e, self.root)
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
        # explained before the cleanup frees the space it took
        reason = checkpoint.explain(error, self.root) if error is not None else None
        self._commit_all_ranks(
            job.step, job.tmp, job.trainer_state, ok=error is None, quiet=True, started=job.started
        )
        if reason is not None:
            self._failed(job.step, reason)
            self.retry_due = time.monotonic() + self.policy.backoff_s

    def _commit_all_ranks(
        self, step: int, tmp: Path, trainer_state: dict, *, ok: bool, quiet=False,
        started: float | None = None,
    ):  # fmt: skip
        flag = torch.tensor([1.0 if ok else 0.0])
        if self.dist.distributed:
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN, group=self.group)
        error: OSError | None = None  # rank 0's, when the commit itself failed
        if flag.item() == 1.0:
            files = self._gather_checksums()
            if self.dist.is_main:
                try:
                    if started is not None:  # how long this storage took: start to commit
                        trainer_state = {
                            **trainer_state,
                            WRITE_SECONDS: round(time.perf_counter() - started, 3),
                        }
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
        reason = checkpoint.explain(error, self.root) if error is not None else None
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
        files = {**files, TRAINER_STATE: file_entry(tmp / TRAINER_STATE, self.dist.rank)}
        problem = check_listed(tmp, files)
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
        keep = retained([step_of(p) for p in found], self.policy)
        for path in found:
            if step_of(path) not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def _mirror(self, folder: Path) -> None:
        if not self.policy.mirror:
            return
        if self._mirror_thread is not None:
            self._mirror_thread.join()  # one copy at a time, in order
        self._mirror_thread = threading.Thread(
            target=checkpoint_mirror.copy, args=(folder, self.policy), daemon=True
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

    def load_latest(self, model, optimizer, fingerprint: str | None = None) -> dict | None:
        """Load the newest verified checkpoint (restoring from the mirror, one of `fingerprint`,
        when the primary is gone); None when there is none."""
        if self.dist.is_main and not committed(self.root) and self.policy.mirror:
            checkpoint_mirror.restore(self.policy.mirror, self.root, fingerprint)
        barrier(self.dist)
        for path in reversed(committed(self.root)):
            problem = verify(path) if self.dist.is_main else None
            bad = torch.tensor([1.0 if problem else 0.0])
            if self.dist.distributed:
                torch_dist.broadcast(bad, src=0, group=self.group)
            if bad.item():
                warn(f"skipping damaged checkpoint {path}: {problem}")
                continue
            started = time.perf_counter()
            state = checkpoint.load(path, model, optimizer, group=self.group)
            if self.dist.is_main:
                info(f"resumed from {path} in {time.perf_counter() - started:.2f} s")
            return state
        return None
