"""benchmarks/gpu_train.py in its CPU smoke mode: it keeps running hanlm's real pretraining step
and reporting its figures, so that the script is ready when a GPU is."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_train.py"


def gpu_train(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "figures.json"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_smoke_trains_each_precision_and_compares_with_the_plan(tmp_path):
    result = gpu_train(tmp_path, "--smoke")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "figures.json").read_text())
    rows = report["configs"]
    assert [r["config"] for r in rows] == ["tiny bf16", "tiny fp8-emulate"]
    for row, planned_precision in zip(rows, ("bf16", "fp8"), strict=True):
        assert row["status"] == "ok"
        t = row["throughput"]
        # 2 timed steps of micro-batch 2 x 64 tokens after 1 warm-up step, each logged
        assert t["timed_tokens"] == 2 * 2 * 64
        assert [w["step"] for w in t["windows"]] == [1, 2, 3]
        assert all(math.isfinite(w["loss"]) for w in t["windows"])
        assert t["tokens_per_s"] > 0 and 0 < t["mfu"] < 1
        # the plan was asked about the setup that trained
        setup = row["plan"]["setup"]
        assert (setup["model"], setup["seq_len"], setup["micro_batch"]) == ("tiny", 64, 2)
        assert (setup["precision"], setup["parallel"], setup["recompute"]) == (
            planned_precision,
            "single",
            "none",
        )
        assert setup["gpus"] * setup["hosts"] == 1 and setup["vocab_size"] == 512
        assert row["measured"]["rss"] > 0
        assert row["memory_vs_plan"] == row["measured"]["rss"] / row["plan"]["total"]
    assert set(report["fp8_over_bf16"]) == {"tiny"}
    assert "FP8/bf16 tokens/s" in result.stdout


@pytest.mark.slow
def test_smoke_compares_muon_with_adamw(tmp_path):
    result = gpu_train(tmp_path, "--smoke", "--precisions", "bf16", "--optimizers", "adamw,muon")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "figures.json").read_text())
    rows = report["configs"]
    assert [r["config"] for r in rows] == ["tiny bf16", "tiny bf16 muon"]
    assert all(r["status"] == "ok" for r in rows)
    # the plan of the Muon row counts Muon's state: one buffer for the blocks' matrices
    items = rows[1]["plan"]["items"]
    assert "optimizer (Muon momentum; AdamW m, v)" in items
    assert (
        items["optimizer (Muon momentum; AdamW m, v)"]
        < rows[0]["plan"]["items"]["optimizer (AdamW m, v)"]
    )
    ratio = report["muon_over_adamw"]["tiny bf16"]
    assert ratio["tokens_per_s"] > 0 and ratio["peak_memory"] > 0
    assert report["fp8_over_bf16"] == {}
    assert "Muon/AdamW tokens/s" in result.stdout


def test_time_limit_skips_what_has_not_started(tmp_path):
    result = gpu_train(tmp_path, "--smoke", "--max-minutes", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((tmp_path / "figures.json").read_text())["configs"]
    assert [r["status"] for r in rows] == ["skipped: --max-minutes reached"] * 2


def test_time_limit_stops_a_running_configuration(tmp_path):
    # 3 seconds: the first worker is still importing torch when the limit stops it
    result = gpu_train(tmp_path, "--smoke", "--max-minutes", "0.05")
    assert result.returncode == 1
    rows = json.loads((tmp_path / "figures.json").read_text())["configs"]
    assert rows[0]["status"] == "stopped at the --max-minutes limit"
    assert rows[1]["status"] == "skipped: --max-minutes reached"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--smoke", "--presets", "nope"), "unknown preset 'nope'"),
        (("--smoke", "--micro-batch", "big"), "cannot read --micro-batch 'big'"),
        (("--smoke", "--steps", "0"), "--steps must be at least 1"),
        (("--smoke", "--optimizers", "lion"), "unknown optimizer 'lion'"),
    ],
)
def test_bad_flags_are_refused_before_anything_runs(tmp_path, args, message):
    result = gpu_train(tmp_path, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "figures.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_to_use_smoke(tmp_path):
    result = gpu_train(tmp_path)
    assert result.returncode == 2
    assert "needs as many CUDA GPUs; this machine has 0" in result.stderr
    assert "--smoke" in result.stderr
