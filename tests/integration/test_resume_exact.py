"""A pretraining run SIGKILLed while it saves a checkpoint and run again logs the same loss at
every step and ends with the same weights bit for bit as the same command never stopped: under
torchrun with 2 CPU ranks in FSDP2 with Muon (in one process, and in FSDP2 with AdamW: `hanlm
rehearse`'s own check, tests/integration/test_rehearse.py).

Each run is started as a user starts it (a process, or a torchrun agent with its ranks); the
kill lands while an asynchronous save is being written (a slowed disk keeps it in flight), after
an earlier checkpoint was committed, so the run resumes from a checkpoint several steps behind
the step it had reached and trains those steps again."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY_PRETRAIN, checkpoint_weights, copy_data_run, losses
from hanlm.launch.torchrun import processes_below
from hanlm.train.checkpoint_layout import INCOMPLETE, committed, latest, verify

STEPS, EVERY = 16, 4
SETTINGS = {
    **TINY_PRETRAIN,
    "pretrain.max_steps": STEPS,
    "checkpoint.every": EVERY,
    "checkpoint.keep_last": 2,
    "logging.log_every": 1,
    "logging.eval_every": 0,
}
SLOW_DISK = {"HANLM_FAULT_WRITE_DELAY_S": "0.4"}  # a save stays in flight long enough to be hit


def _command(run_dir: Path, mode: str, optimizer: str) -> list[str]:
    args = ["-m", "hanlm", "pretrain", "--run-dir", str(run_dir)]
    for key, value in {**SETTINGS, "optimizer.name": optimizer}.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [sys.executable, *launcher, *args, "--parallel", mode]


def _start(run_dir: Path, mode: str, optimizer: str, log: Path, extra_env: dict | None = None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(extra_env or {})}
    with open(log, "a") as out:
        return subprocess.Popen(
            _command(run_dir, mode, optimizer), stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip


def _kill_all(process: subprocess.Popen) -> None:
    """SIGKILL the process and every process below it (torchrun's ranks run in sessions of
    their own)."""
    for pid in [process.pid, *processes_below(process.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def _kill_while_saving(run_dir: Path, process: subprocess.Popen, after: int, log: Path) -> int:
    """Wait until a checkpoint of step >= `after` is committed and a later one is being written,
    then kill everything; the step of the newest committed checkpoint."""
    root = run_dir / "pretrain" / "checkpoints"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        newest = latest(root) if root.is_dir() else None
        done = int(newest.name.split("-")[1]) if newest is not None else 0
        if done >= after and list(root.glob(f"step-*{INCOMPLETE}")):
            _kill_all(process)
            return done
        if process.poll() is not None:
            pytest.fail(f"the run ended before it could be killed:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)
    _kill_all(process)
    pytest.fail(f"no save was caught in flight:\n{log.read_text()[-3000:]}")


def _finish(run_dir: Path, mode: str, optimizer: str, log: Path) -> None:
    process = _start(run_dir, mode, optimizer, log)
    assert process.wait(timeout=300) == 0, log.read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,optimizer",
    # Muon's state (a momentum buffer per block matrix, sharded as its weight) under FSDP2; one
    # process and FSDP2 with AdamW on 2 ranks are `hanlm rehearse`'s own stop-and-resume check
    # (tests/integration/test_rehearse.py: the demo recipe, and the 2-rank rehearsal); DDP's
    # resume on every rank is tests/integration/test_checkpoint_ranks.py's, and a kill in a save
    # leaves the same committed checkpoints whatever the parallel mode (checkpoint_layout)
    [("fsdp", "muon")],
)
def test_a_run_killed_while_saving_resumes_to_the_same_bits(demo_run, tmp_path, mode, optimizer):
    whole = copy_data_run(demo_run, tmp_path / "whole")
    _finish(whole, mode, optimizer, tmp_path / "whole.log")

    run_dir = copy_data_run(demo_run, tmp_path / "killed")
    log = tmp_path / "killed.log"
    after = random.Random(mode).choice([EVERY, 2 * EVERY])  # which save the kill lands in
    process = _start(run_dir, mode, optimizer, log, SLOW_DISK)
    killed_at = _kill_while_saving(run_dir, process, after, log)
    newest = latest(run_dir / "pretrain" / "checkpoints")
    assert newest is not None and verify(newest) is None
    assert after <= killed_at < STEPS
    _finish(run_dir, mode, optimizer, log)
    if optimizer == "muon":
        assert "optimizer: Muon on the blocks' 14 matrices" in log.read_text()  # 2 layers x 7

    expected, got = losses(whole), losses(run_dir)
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert got == expected  # every step's loss, to the last bit
    final = [checkpoint_weights(latest(r / "pretrain" / "checkpoints")) for r in (whole, run_dir)]
    assert final[0].keys() == final[1].keys()
    for name, tensor in final[0].items():
        assert torch.equal(final[1][name], tensor), name
    assert [p.name for p in committed(run_dir / "pretrain" / "checkpoints")][-1] == (
        f"step-{STEPS:08d}"
    )
