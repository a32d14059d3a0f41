"""Checkpoints through torch.distributed.checkpoint (DCP): the writers, saving and loading.

Each rank reads back and checksums the files it wrote, in the thread that wrote them (DCP's save
thread when the save is asynchronous); the manager (hanlm.train.checkpoint_manager) gathers the
checksums at the commit and rank 0 writes the manifest, so no rank reads the whole checkpoint on
the training thread. Under DDP every rank holds the same state: rank 0 alone stages (copies)
and writes it, instead of every rank staging a full copy of which DCP then writes only a part.

An asynchronous save (`save_async`, `dcp.async_save`) stages the state into host memory before
it returns, so the next optimizer step cannot change what is written. Loading reshards: any
number of ranks loads what any number saved. A failed save is explained in one line (`explain`):
a full disk said as such, however torch reports it. Test hooks: HANLM_FAULT_WRITE_DELAY_S slows
every file write (a slow disk) and HANLM_FAULT_WRITE_ERRORS=errno:count fails the next `count`
writes with that errno.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import shutil
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from hanlm.files import read_json
from hanlm.train.checkpoint_layout import TRAINER_STATE, file_entry

# -- why a save failed ------------------------------------------------------------------------

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


def explain(error: BaseException, folder: Path) -> str:
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


# -- the writers: checksums in the writing thread; faults for tests and benchmarks ------------


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
            self.checksums[path.name] = file_entry(path, self._my_rank)
        return written

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)  # the coordinator writes DCP's .metadata
        for path in Path(self.path).glob("*.metadata"):
            self.checksums[path.name] = file_entry(path, self._my_rank)


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


def writer(path: Path) -> _ChecksummingWriter:
    """The storage writer of the checkpoints under `path`: checksumming, and faulty when a test
    hook is set."""
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


# -- saving and loading ------------------------------------------------------------------------


def state_dict(model, optimizer) -> dict:
    """The model's and the optimizer's state as DCP saves and loads it."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def is_sharded(state: dict) -> bool:
    """Whether any tensor of a (nested) state dict is a DTensor, i.e. split over ranks (FSDP)."""
    from torch.distributed.tensor import DTensor  # deferred: as torch.distributed.checkpoint

    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(is_sharded(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(is_sharded(v) for v in state)
    return False


def save_async(
    state: dict, folder: Path, storage: FileSystemWriter, *, group, alone: bool
) -> concurrent.futures.Future:
    """Stage `state` into host memory and write it to `folder` in DCP's save thread; the future
    is done once this rank's files are written. `alone`: this rank writes without the others."""
    with _single_process_ok():
        return dcp.async_save(
            state,
            checkpoint_id=str(folder),
            storage_writer=storage,
            process_group=group,
            no_dist=alone,
        )


def save(state: dict, folder: Path, storage: FileSystemWriter, *, group, alone: bool) -> None:
    """Write `state` to `folder` before returning (see save_async)."""
    with _single_process_ok():
        dcp.save(
            state,
            checkpoint_id=str(folder),
            storage_writer=storage,
            process_group=group,
            no_dist=alone,
        )


def load(path: Path, model, optimizer, group=None) -> dict:
    """Load model and optimizer state in place (any number of ranks: DCP reshards)."""
    state = state_dict(model, optimizer)
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(path), process_group=group)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return read_json(Path(path) / TRAINER_STATE)


def rng_state() -> dict:
    return {"torch": torch.get_rng_state().tolist()}


def set_rng_state(state: dict) -> None:
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
