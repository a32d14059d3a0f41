"""A preempted `hanlm sft` under torchrun (2 CPU ranks), stopped the hardest way: its agent loses
the rendezvous store and SIGTERMs both ranks, which save, say so and exit 75, and `hanlm
torchrun` exits 75 too (torchrun itself would raise, or exit 1). Pretraining is rehearsed through
`hanlm run` on two nodes, a SIGTERM to one rank making every rank stop, in
tests/integration/test_launch.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_PRETRAIN, copy_data_run
from hanlm import exit_status
from hanlm.config import load_config
from hanlm.pipeline import run_stage
from processes import free_port

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


@pytest.fixture
def data_run(demo_run, tmp_path) -> Path:
    return copy_data_run(demo_run, tmp_path / "run")


STORE = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False)
print("listening", flush=True)
time.sleep(600)
"""


def test_sft_under_torchrun_whose_agent_loses_its_rendezvous_store_exits_75(data_run, tmp_path):
    """`hanlm sft` on 2 ranks under an agent whose rendezvous store is lost: the store lives with
    the host whose agent started first, and losing that host makes every other agent fail and
    stop its workers with SIGTERM, their exit codes lost with it. Both ranks save and say so, and
    `hanlm torchrun` still exits with their status (75: saved and stopped), which each reported
    to it."""
    cfg = load_config(None, {**SETTINGS, "pretrain.max_steps": 4})
    run_stage("pretrain", cfg, data_run)  # the model SFT starts from, in this process
    settings = {**SETTINGS, "sft.max_steps": 400, "sft.micro_batch": 2, "sft.batch_rows": 4}
    settings["sft.logging.log_every"] = 1
    port = free_port()
    store = subprocess.Popen(  # stands in for the first host's agent
        [sys.executable, "-c", STORE, str(port)], stdout=subprocess.PIPE, text=True
    )
    cmd = [sys.executable, "-m", "hanlm", "torchrun", "--nnodes", "1", "--nproc-per-node", "2"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--rdzv-conf", "is_host=false", "--monitor-interval", "0.2", "-m", "hanlm"]
    cmd += ["sft", "--run-dir", str(data_run), *settings_args(settings)]
    try:
        assert store.stdout.readline().strip() == "listening"
        metrics = data_run / "sft" / "metrics.jsonl"
        # the first host is gone
        code, said = run_until_a_step(cmd, metrics, tmp_path / "log", lambda _: store.kill())
    finally:
        store.kill()
    assert code == exit_status.STOPPED, said[-3000:]
    assert "RendezvousConnectionError" in said and said.count("preempted:") == 2, said[-3000:]
    assert "ranks exited with [75]: exit status 75" in said
