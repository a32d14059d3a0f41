"""A preempted `hanlm sft` under torchrun (2 CPU ranks): a SIGTERM to one rank makes every rank
save, say so and exit 75, and `hanlm torchrun` exits 75 too (torchrun itself would exit 1).
Pretraining is rehearsed the same way, through `hanlm run` on two nodes, in
tests/integration/test_launch.py. And an agent that loses its rendezvous store still exits with
its ranks' status."""

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
from processes import free_port, ranks_below

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

SETTINGS = {**TINY_PRETRAIN, "pretrain.micro_batch": 2, "checkpoint.backoff_s": 0.0}


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def run_until_a_step(cmd: list[str], metrics: Path, log: Path, stop) -> tuple[int, str]:
    """`cmd` (a `hanlm torchrun` agent); once a step is logged, `stop(agent)`. Its exit status
    and what it said."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with open(log, "w") as out:
        agent = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and agent.poll() is None:
            if metrics.is_file() and metrics.read_text().strip():
                break
            time.sleep(0.05)
        assert agent.poll() is None, log.read_text()[-3000:]
        stop(agent)
        return agent.wait(timeout=120), log.read_text()
    finally:
        if agent.poll() is None:
            agent.kill()


def stop_one_rank(command: list[str], metrics: Path, log: Path) -> tuple[int, str]:
    """`hanlm torchrun` on 2 ranks running `command`; SIGTERM to rank 1 once a step is
    logged."""
    cmd = [sys.executable, "-m", "hanlm", "torchrun", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "hanlm", *command]
    return run_until_a_step(
        cmd, metrics, log, lambda agent: os.kill(ranks_below(agent.pid)[1], signal.SIGTERM)
    )


@pytest.fixture
def data_run(demo_run, tmp_path) -> Path:
    return copy_data_run(demo_run, tmp_path / "run")


def test_sft_under_torchrun_exits_75(data_run, tmp_path):
    cfg = load_config(None, {**SETTINGS, "pretrain.max_steps": 4})
    run_stage("pretrain", cfg, data_run)  # the model SFT starts from, in this process
    settings = {**SETTINGS, "sft.max_steps": 400, "sft.micro_batch": 2, "sft.batch_rows": 4}
    settings["sft.logging.log_every"] = 1
    args = ["sft", "--run-dir", str(data_run), *settings_args(settings)]
    code, said = stop_one_rank(args, data_run / "sft" / "metrics.jsonl", tmp_path / "log")
    assert code == exit_status.STOPPED, said[-3000:]
    assert said.count("preempted:") == 2


STORE = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False)
print("listening", flush=True)
time.sleep(600)
"""


def test_an_agent_that_loses_its_rendezvous_store_exits_with_its_ranks_status(data_run, tmp_path):
    """The c10d store lives with the host whose agent started first; losing that host makes every
    other agent fail and stop its workers, their exit codes lost with it. `hanlm torchrun` still
    exits with its ranks' status (75: saved and stopped), which each reported to it."""
    port = free_port()
    store = subprocess.Popen(  # stands in for the first host's agent
        [sys.executable, "-c", STORE, str(port)], stdout=subprocess.PIPE, text=True
    )
    settings = {**SETTINGS, "pretrain.max_steps": 400, "checkpoint.every": 1000}
    cmd = [sys.executable, "-m", "hanlm", "torchrun", "--nnodes", "1", "--nproc-per-node", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--rdzv-conf", "is_host=false", "--monitor-interval", "0.2", "-m", "hanlm"]
    cmd += ["pretrain", "--run-dir", str(data_run), *settings_args(settings)]
    try:
        assert store.stdout.readline().strip() == "listening"
        metrics = data_run / "pretrain" / "metrics.jsonl"
        # the first host is gone
        code, said = run_until_a_step(cmd, metrics, tmp_path / "log", lambda _: store.kill())
    finally:
        store.kill()
    assert code == exit_status.STOPPED, said[-3000:]
    assert "RendezvousConnectionError" in said and "preempted:" in said
    assert "ranks exited with [75]: exit status 75" in said
