"""Muon under FSDP2 on 2 CPU ranks: each rank holds row shards of a block's matrices, Newton-Schulz
runs on the gathered whole, and the losses equal one process's on the same batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import TINY_PRETRAIN, copy_data_run, losses
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config

SETTINGS = {**TINY_PRETRAIN, "pretrain.max_steps": 6, "optimizer.name": "muon",
            "optimizer.muon_lr": 0.02, "logging.eval_every": 0, "checkpoint.every": 6}  # fmt: skip


@pytest.mark.slow
def test_two_rank_fsdp2_muon_equals_one_process(demo_run, tmp_path):
    single = copy_data_run(demo_run, tmp_path / "single")
    run_stage("pretrain", load_run_config(single, values=SETTINGS), single)
    ranks = copy_data_run(demo_run, tmp_path / "ranks")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hanlm", "pretrain", "--run-dir", str(ranks), "--parallel", "fsdp"]  # fmt: skip
    for key, value in SETTINGS.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "optimizer: Muon on the blocks' 14 matrices" in result.stdout + result.stderr
    one, two = losses(single), losses(ranks)
    assert sorted(one) == sorted(two) == list(range(1, 7))
    assert one[6] < one[1]  # it learns
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
