"""Save and resume training with torch.distributed.checkpoint (DCP).

A checkpoint is a folder `step-NNNNNNNN/` holding the sharded model and optimizer state (each rank
writes its own shards) and `trainer.json` (step, tokens, loader and schedule state, fingerprint).
It is written as `step-N.incomplete/` and renamed when complete; `latest` names the newest one.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from hanlm.errors import UserError
from hanlm.io import atomic_write_json, atomic_write_text, fsync_dir, read_json
from hanlm.train.parallel import Dist, barrier

LATEST = "latest"
TRAINER_STATE = "trainer.json"


@contextlib.contextmanager
def _single_process_ok():
    # DCP warns that it "assumes" a single process when there is no process group: we mean it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def save(root: Path, step: int, model, optimizer, trainer_state: dict, d: Dist) -> Path:
    """Write a checkpoint for `step` on every rank; rank 0 commits it and moves `latest`."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".incomplete")
    if d.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(d)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _single_process_ok():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    barrier(d)
    if d.is_main:
        atomic_write_json(tmp / TRAINER_STATE, trainer_state)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        fsync_dir(root)
        atomic_write_text(root / LATEST, final.name + "\n")
    barrier(d)
    return final


def latest(root: Path) -> Path | None:
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    if not (path / TRAINER_STATE).is_file():
        raise UserError(
            f"the latest checkpoint {path} is missing or incomplete",
            fix=f"remove {pointer} to start over, or restore the folder",
        )
    return path


def load(path: Path, model, optimizer) -> dict:
    """Load model and optimizer state in place (any number of ranks: DCP reshards)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return read_json(Path(path) / TRAINER_STATE)


def rng_state() -> dict:
    return {"torch": torch.get_rng_state().tolist()}


def set_rng_state(state: dict) -> None:
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
