"""The rehearsal's stop and resume: pretraining started as the run starts it, stopped hard
(SIGKILL, every rank) while an asynchronous save is in flight, started again, and its losses
compared step by step with the rehearsal's own uninterrupted pretraining.

It runs in a folder of its own (`RUN/rehearsal/resume/`, its checkpoints under the mirror's
`RUN/rehearsal/resume/pretrain`) on the rehearsal's shards and tokenizer. While it runs, each
checkpoint file's write is slowed by `HOLD_SAVE_S` (hanlm.train.checkpoint's write-delay hook),
so that a save is still in flight when the stop comes, on a fast disk too. On a CPU, hanlm
promises the same bits (docs/checkpoints.md); on a GPU, whose kernels do not, the losses must
agree within `GPU_TOLERANCE` of their size.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hanlm import exit_status, ranks
from hanlm.errors import UserError
from hanlm.launch.torchrun import processes_below
from hanlm.stages.rundir import RunDir
from hanlm.train.checkpoint_layout import INCOMPLETE, latest, step_of
from hanlm.train.results import read_metrics

HOLD_SAVE_S = 0.3  # seconds each checkpoint file's write is held: the stop lands in a save
EVERY = 5  # the stopped run saves every 5 steps: it is stopped in its second save
COMPARED = 5  # steps the resumed run trains, each compared with the uninterrupted run's
GPU_TOLERANCE = 0.01  # |loss resumed - loss uninterrupted| / loss, where bits are not promised
WAIT_S = 1800  # the longest a rehearsal's pretraining may take before it is called stuck
SHARED = ("tokenizer", "shards")  # the rehearsal's folders the resumed run reads


def link_shared(sub: RunDir, folder: RunDir) -> None:
    """`folder`'s tokenizer and shards: links to the rehearsal's (relative)."""
    folder.root.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        link = folder.stage(name)
        if not link.is_symlink():
            link.symlink_to(Path(os.path.relpath(sub.stage(name), link.parent)), True)


def _command(folder: RunDir, config: Path, rank_count: int, *extra: str) -> list[str]:
    pretrain = ["-m", "hanlm", "pretrain", "--run-dir", str(folder.root), "--config", str(config)]
    pretrain += extra
    if rank_count == 1:
        return [sys.executable, *pretrain]
    launcher = ["-m", "hanlm", "torchrun", "--standalone", "--nproc-per-node", str(rank_count)]
    return [sys.executable, *launcher, *pretrain]


def _start(command: list[str], log: Path, hold: bool) -> subprocess.Popen:
    env = ranks.without_launch(dict(os.environ))  # the child is a launch of its own
    if hold:
        env["HANLM_FAULT_WRITE_DELAY_S"] = str(HOLD_SAVE_S)
    with open(log, "a") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL every rank, then the launcher: a hard stop, as a lost host stops a run; wait
    until they are gone (and their hold on the run folder with them)."""
    children = processes_below(process.pid)
    for pid in [*children, process.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in children):
        time.sleep(0.05)


def _stop_in_flight(process: subprocess.Popen, root: Path, log: Path) -> tuple[int, int]:
    """Wait until a checkpoint is committed and a later one is being written, then stop every
    rank hard; (the step of the newest committed checkpoint, the step being saved)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        newest = latest(root) if root.is_dir() else None
        writing = list(root.glob(f"step-*{INCOMPLETE}")) if newest is not None else []
        if writing:
            _kill(process)
            return step_of(newest), step_of(writing[0])
        if process.poll() is not None:
            raise UserError(
                f"the rehearsal's pretraining ended (exit {process.returncode}) before a save "
                "could be stopped in flight",
                where=str(log),
                fix="read its log; run the rehearsal again",
            )
        time.sleep(0.01)
    _kill(process)
    raise UserError(f"the rehearsal's pretraining made no checkpoint in {WAIT_S} s", where=str(log))


def stop_and_resume(sub: RunDir, config: Path, rank_count: int, *, exact: bool) -> dict[str, Any]:
    """Pretraining in RUN/rehearsal/resume, stopped hard in a save and resumed, against the
    rehearsal's own pretraining (same recipe, same steps): the figures, and whether the
    losses agree (`exact`: bit for bit, else within GPU_TOLERANCE)."""
    folder = RunDir(sub.root / "resume")
    link_shared(sub, folder)
    log = folder.root / "pretrain.log"
    # a save every EVERY steps: the first is committed, the second is stopped in flight
    every = ["--set", f"checkpoint.every={EVERY}"]
    process = _start(_command(folder, config, rank_count, *every), log, hold=True)
    committed_step, in_flight = _stop_in_flight(process, folder.pretrain.checkpoints, log)
    started = time.perf_counter()
    again = _command(folder, config, rank_count, *every, "--stop-after-steps", str(COMPARED))
    resumed = _start(again, log, hold=False)
    if resumed.wait(timeout=WAIT_S) not in (exit_status.SUCCESS, exit_status.STOPPED):
        raise UserError(
            f"the rehearsal's pretraining did not resume from step {committed_step} "
            f"(exit {resumed.returncode})",
            where=str(log),
            fix="read its log: the same command resumes a real run",
        )
    restart_s = time.perf_counter() - started
    loads = re.findall(r"resumed from \S+ in ([\d.]+) s", log.read_text(errors="replace"))
    expected = {r.step: r.loss for r in read_metrics(sub.pretrain.metrics)}
    got = {r.step: r.loss for r in read_metrics(folder.pretrain.metrics)}
    compared = sorted(set(expected) & {s for s in got if s > committed_step})
    if not compared:
        raise UserError(
            "the resumed pretraining logged no step after its checkpoint", where=str(log)
        )
    diffs = [abs(got[s] - expected[s]) for s in compared]
    relative = max(d / max(abs(expected[s]), 1e-12) for d, s in zip(diffs, compared, strict=True))
    agree = max(diffs) == 0.0 if exact else relative <= GPU_TOLERANCE
    return {
        "stopped_in_save_of_step": in_flight,
        "resumed_from_step": committed_step,
        "load_s": float(loads[-1]) if loads else None,
        "restart_s": restart_s,
        "steps_compared": len(compared),
        "max_loss_difference": max(diffs),
        "max_relative_difference": relative,
        "promise": "bit for bit" if exact else f"within {GPU_TOLERANCE:.0%} of the loss",
        "agree": agree,
    }
