"""A preempted `hanlm pretrain` and `hanlm sft` under torchrun (2 CPU ranks): a SIGTERM to one
rank makes every rank save, say so and exit 75, and `hanlm torchrun` exits 75 too (torchrun
itself would exit 1). `hanlm run` is rehearsed the same way in tests/integration/test_launch.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_PRETRAIN, copy_data_run
from hanlm import exit_status
from hanlm.config import load_config
from hanlm.pipeline import run_stage
from processes import ranks_below

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

SETTINGS = {**TINY_PRETRAIN, "pretrain.micro_batch": 2, "checkpoint.backoff_s": 0.0}


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def stop_one_rank(command: list[str], metrics: Path, log: Path) -> tuple[int, str]:
    """`hanlm torchrun` on 2 ranks running `command`; SIGTERM to rank 1 once a step is
    logged. Its exit status and what it said."""
    cmd = [sys.executable, "-m", "hanlm", "torchrun", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with open(log, "w") as out:
        agent = subprocess.Popen(
            [*cmd, "-m", "hanlm", *command], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and agent.poll() is None:
            if metrics.is_file() and metrics.read_text().strip():
                break
            time.sleep(0.05)
        assert agent.poll() is None, log.read_text()[-3000:]
        os.kill(ranks_below(agent.pid)[1], signal.SIGTERM)
        return agent.wait(timeout=120), log.read_text()
    finally:
        if agent.poll() is None:
            agent.kill()


@pytest.fixture
def data_run(demo_run, tmp_path) -> Path:
    return copy_data_run(demo_run, tmp_path / "run")


def test_pretrain_under_torchrun_exits_75(data_run, tmp_path):
    settings = {**SETTINGS, "pretrain.max_steps": 400, "checkpoint.every": 1000}
    args = ["pretrain", "--run-dir", str(data_run), *settings_args(settings)]
    code, said = stop_one_rank(args, data_run / "pretrain" / "metrics.jsonl", tmp_path / "log")
    assert code == exit_status.STOPPED, said[-3000:]
    assert said.count("preempted:") == 2 and "exit status 75" in said
    assert "ranks exited with [75]" in said  # every rank: 75


def test_sft_under_torchrun_exits_75(data_run, tmp_path):
    cfg = load_config(None, {**SETTINGS, "pretrain.max_steps": 4})
    run_stage("pretrain", cfg, data_run)  # the model SFT starts from, in this process
    settings = {**SETTINGS, "sft.max_steps": 400, "sft.micro_batch": 2, "sft.batch_rows": 4}
    settings["sft.logging.log_every"] = 1
    args = ["sft", "--run-dir", str(data_run), *settings_args(settings)]
    code, said = stop_one_rank(args, data_run / "sft" / "metrics.jsonl", tmp_path / "log")
    assert code == exit_status.STOPPED, said[-3000:]
    assert said.count("preempted:") == 2
