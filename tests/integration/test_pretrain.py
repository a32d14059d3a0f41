"""The pretraining loop: learning, precision refusals, resume, and 2-process DDP/FSDP2 equivalence."""

import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import (
    TINY_PRETRAIN,
    assert_user_error,
    checkpoint_weights,
    copy_data_run,
    losses,
    metrics,
)
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config
from hanlm.train.checkpoint_layout import latest
from hanlm.train.results import PretrainSummary

TINY = TINY_PRETRAIN


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


@pytest.fixture
def run_dir(demo_run, tmp_path):
    return copy_data_run(demo_run, tmp_path / "run")


def train(run_dir, **extra):
    stop = extra.pop("stop_after_steps", None)
    cfg = load_run_config(run_dir, values={**TINY, **extra})
    return run_stage("pretrain", cfg, run_dir, stop_after_steps=stop)


def test_loss_falls_and_metrics_are_logged(run_dir):
    summary = train(run_dir, **{"pretrain.max_steps": 30, "logging.eval_every": 10})
    assert isinstance(summary, PretrainSummary)
    assert summary.completed and summary.step == 30
    assert summary == PretrainSummary.read(run_dir / "pretrain" / PretrainSummary.FILE)
    records = [r for r in metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 31))
    first, last = records[0], records[-1]
    assert last["loss"] < first["loss"] - 1.0
    for key in ("lr", "tokens_per_s", "grad_norm", "mfu", "peak_memory_gb", "tokens"):
        assert key in last
    assert last["tokens"] == 30 * 512
    val = [r for r in metrics(run_dir) if "val_loss" in r]
    assert [r["step"] for r in val] == [10, 20, 30]
    assert val[-1]["val_loss"] < val[0]["val_loss"]
    assert 0 < val[-1]["val_bpb"] < 8
    assert (run_dir / "pretrain" / "checkpoints" / "latest").read_text().strip() == "step-00000030"
    assert (run_dir / "pretrain" / "stage.json").is_file()


def test_mfu_never_reads_over_100_percent_on_a_busy_cpu(run_dir, monkeypatch):
    """A CPU's peak is one matmul measured once: taken while the machine was busy it is low,
    and MFU against it would read over 100%. Training's own rate then raises it."""
    from hanlm.train import build

    monkeypatch.setattr(build, "device_peak_flops", lambda device, name: (1e3, "measured"))
    train(run_dir, **{"pretrain.max_steps": 4})
    mfu = [r["mfu"] for r in metrics(run_dir) if "mfu" in r]
    assert mfu[0] == 1.0 and all(0 < m <= 1.0 for m in mfu)


def test_schedule_warmup_then_cosine(run_dir):
    train(
        run_dir,
        **{"pretrain.max_steps": 10, "optimizer.warmup_steps": 3, "optimizer.min_lr_ratio": 0.1},
    )
    lrs = [r["lr"] for r in metrics(run_dir) if "lr" in r]
    assert lrs[:3] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2])
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(lrs[2:]))
    assert lrs[-1] > 1e-3  # the floor is reached after the last step, not before


def test_stop_and_resume_continue_steps_schedule_and_data(run_dir, tmp_path):
    whole = tmp_path / "whole"
    shutil.copytree(run_dir, whole)
    train(whole)
    expected = losses(whole)

    first = train(run_dir, stop_after_steps=4)  # stops right after the step-4 checkpoint
    assert first.step == 4 and not first.completed
    assert not (run_dir / "pretrain" / "stage.json").exists()
    second = train(run_dir)
    assert second.completed and second.step == 8
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(1, 9))  # no step logged twice, none missing
    lrs_whole = [r["lr"] for r in metrics(whole) if "lr" in r]
    lrs_resumed = [r["lr"] for r in metrics(run_dir) if "lr" in r]
    assert lrs_resumed == lrs_whole
    for step in range(5, 9):
        assert resumed[step] == expected[step]  # bit for bit


def test_document_masking_trains_resumes_exactly_and_is_in_effect(run_dir, tmp_path):
    masking = {"pretrain.max_steps": 4, "pretrain.document_masking": True}
    plain, whole = tmp_path / "plain", tmp_path / "whole"
    shutil.copytree(run_dir, plain)
    shutil.copytree(run_dir, whole)
    train(whole, **masking)
    expected = losses(whole)
    train(run_dir, stop_after_steps=2, **masking)
    train(run_dir, **masking)
    resumed = losses(run_dir)
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):
        assert resumed[step] == expected[step]  # bit for bit
    train(plain, **{"pretrain.max_steps": 4})
    without = losses(plain)
    assert without[1] != expected[1]  # the demo's windows hold several documents each


def test_complete_stage_is_skipped(run_dir):
    train(run_dir, **{"pretrain.max_steps": 2})
    marker = (run_dir / "pretrain" / "stage.json").read_text()
    summary = train(run_dir, **{"pretrain.max_steps": 2})
    assert summary.step == 2
    assert (run_dir / "pretrain" / "stage.json").read_text() == marker


def test_fp8_emulate_trains_close_to_fp32(run_dir, tmp_path):
    fp8 = tmp_path / "fp8"
    shutil.copytree(run_dir, fp8)
    common = {
        "pretrain.max_steps": 10,
        "model.preset": "demo",
        "pretrain.micro_batch": 2,
        "pretrain.global_batch_tokens": 256,
        "optimizer.lr": 3e-3,
    }
    train(run_dir, **common)
    train(fp8, **common, **{"precision.mode": "fp8-emulate"})
    a, b = losses(run_dir), losses(fp8)
    assert b[10] < b[1] - 0.5
    assert all(abs(a[s] - b[s]) / a[s] < 0.02 for s in a)
    assert any(a[s] != b[s] for s in a)  # FP8 casting really happened


def test_precision_refusals(run_dir, cli):
    tiny = {k: v for k, v in TINY.items() if k != "precision.mode"}
    args = ["pretrain", "--run", run_dir, *settings_args(tiny)]
    assert_user_error(cli(*args, "--precision", "fp8"), "fp8-emulate", "compute capability 8.9")
    assert_user_error(cli(*args, "--precision", "fp4"), "FP8")
    assert_user_error(cli(*args, "--precision", "fp16"), "precision.mode")
    assert not (run_dir / "pretrain" / "checkpoints").exists()


def test_bad_batch_and_missing_length(run_dir, cli):
    args = ["pretrain", "--run", run_dir, *settings_args(TINY)]
    assert_user_error(cli(*args, "--set", "pretrain.global_batch_tokens=300"), "not a multiple")
    with pytest.raises(UserError, match="needs a length"):
        train(run_dir, **{"pretrain.max_steps": None})
    assert_user_error(cli(*args, "--set", "model.preset=huge"), "unknown", "tiny")


def test_no_shards_is_a_user_error(tmp_path, cli):
    assert_user_error(
        cli("pretrain", "--run", tmp_path / "empty", "--max-steps", "1"), "no finished shards"
    )


def torchrun(run_dir, parallel: str, **extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "hanlm",
        "pretrain",
        "--run-dir",
        str(run_dir),
        "--parallel",
        parallel,
        *settings_args({**TINY, **extra}),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return losses(run_dir)


@pytest.mark.slow
def test_ddp_matches_one_process(run_dir, tmp_path):
    ddp = tmp_path / "ddp"
    shutil.copytree(run_dir, ddp)
    train(run_dir)
    single = losses(run_dir)
    got = torchrun(ddp, "ddp")
    assert sorted(got) == sorted(single)
    for step, loss in single.items():
        assert abs(got[step] - loss) / loss < 1e-4, (step, got[step], loss)
    summary = PretrainSummary.read(ddp / "pretrain" / PretrainSummary.FILE)
    assert summary.world_size == 2 and summary.mode == "ddp"


@pytest.mark.slow
def test_fsdp_resumes_a_one_process_run_and_matches_it(run_dir, tmp_path):
    """Stopped in one process, resumed under torchrun with 2 FSDP2 ranks (document masking on):
    DCP reshards, the data order continues where it stopped, and every step's loss is the one
    process's, and its export holds the weights the ranks' shards held. (FSDP2 from step 0: test_model_init builds the same weights under FSDP2, and
    test_loss takes the same loss and gradients.)"""
    masking = {"pretrain.document_masking": True}
    whole = tmp_path / "whole"
    shutil.copytree(run_dir, whole)
    train(whole, **masking)
    train(run_dir, stop_after_steps=4, **masking)
    got = torchrun(run_dir, "fsdp", **masking)
    expected = losses(whole)
    assert sorted(got) == sorted(expected)
    for step, loss in expected.items():
        assert abs(got[step] - loss) / loss < 1e-4, (step, got[step], loss)
    summary = PretrainSummary.read(run_dir / "pretrain" / PretrainSummary.FILE)
    assert summary.world_size == 2 and summary.mode == "fsdp" and summary.completed
    # the checkpoint the 2 ranks wrote (each its shards) exports to the weights it holds
    record = run_stage("export", load_run_config(run_dir, values={**TINY, **masking}), run_dir)
    assert record.step == max(expected)
    held = checkpoint_weights(latest(run_dir / "pretrain" / "checkpoints"))
    exported = load_file(run_dir / "pretrain" / "hf" / "model.safetensors")
    assert "model.embed_tokens.weight" in exported and exported.keys() <= held.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor, held[name]), name


def test_activation_checkpointing_gives_the_same_losses(run_dir, tmp_path):
    other = tmp_path / "ac"
    shutil.copytree(run_dir, other)
    train(run_dir, **{"pretrain.max_steps": 3})
    train(other, **{"pretrain.max_steps": 3, "parallel.activation_checkpointing": True})
    assert losses(other) == pytest.approx(losses(run_dir), rel=1e-6)
