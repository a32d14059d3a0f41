"""Training faults: a diverging loss, non-finite weights at export, a full checkpoint disk, and
what a run resumed at odd moments reports.

A diverging run stops with exit status 2 and one message (the step, the value, the checkpoint
to continue from, the fixes), never marks its stage complete and never commits a non-finite
checkpoint; export names non-finite tensors instead of blaming the tied embeddings; a save that
runs out of space says so, whatever torch's serializer calls it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from collections import namedtuple
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from conftest import TINY_PRETRAIN, assert_user_error, copy_data_run, losses, metrics
from hanlm.errors import UserError
from hanlm.model import build_model, model_config
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config
from hanlm.train import checkpoint, checkpoint_layout, export, parallel
from hanlm.train.checkpoint_manager import CheckpointError, CheckpointManager
from hanlm.train.results import PretrainSummary

# Eight tiny steps; checkpoints at 4 and 8.
TINY = {**TINY_PRETRAIN, "logging.eval_every": 0}


@pytest.fixture
def run_dir(demo_run, tmp_path):
    return copy_data_run(demo_run, tmp_path / "run")


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def train(run_dir, stop_after_steps=None, **extra):
    cfg = load_run_config(run_dir, values={**TINY, **extra})
    return run_stage("pretrain", cfg, run_dir, stop_after_steps=stop_after_steps)


def tiny_config(run_dir: Path):
    vocab = json.loads((run_dir / "shards" / "manifest.json").read_text())["vocab_size"]
    return model_config("tiny", vocab_size=vocab, seq_len=TINY["pretrain.seq_len"])


# -- a diverging loss ------------------------------------------------------------------------------

# With this learning rate the tiny model's gradient norm is NaN from step 3 on; the loop reads
# each step's numbers one step late, so a limit of N stops after step 3 + N.
DIVERGING = {"optimizer.lr": 1e6}
SYNC = {"checkpoint.async_save": False}
ASYNC = {"checkpoint.async_save": True}  # a save is committed at the next step, after the check
Divergence = namedtuple("Divergence", "limit saves says committed_steps")


@pytest.mark.parametrize(
    "case",
    [
        Divergence(1, SYNC, ["step 3 had a non-finite", "no checkpoint was committed"], []),
        Divergence(2, SYNC, ["steps 3 to 4 had a non-finite", "step-00000004"], [4]),
        # step 4's save is still in flight when step 4 is found non-finite: it is abandoned
        Divergence(2, ASYNC, ["steps 3 to 4", "no checkpoint was committed"], []),
    ],
    ids=["limit-1", "limit-2", "limit-2-async"],
)
def test_a_diverging_run_stops_with_the_diagnosis_and_keeps_only_finite_checkpoints(
    run_dir, cli, case
):
    limit, says, committed_steps = case.limit, case.says, case.committed_steps
    values = {**TINY, **DIVERGING, **case.saves, "optimizer.max_nonfinite_steps": limit}
    result = cli("pretrain", "--run", run_dir, *settings_args(values))
    assert_user_error(
        result,
        "training diverged",
        "the gradient norm was nan",
        f"optimizer.max_nonfinite_steps = {limit}",
        "lower optimizer.lr (now 1e+06)",
        "optimizer.warmup_steps",
        "optimizer.grad_clip",
    )
    for needle in says:
        assert needle in result.err
    assert result.err.count("error:") == 1
    assert not (run_dir / "pretrain" / "stage.json").exists()
    assert not (run_dir / "pretrain" / "summary.json").exists()
    root = run_dir / "pretrain" / "checkpoints"
    assert [int(p.name.split("-")[1]) for p in checkpoint_layout.committed(root)] == committed_steps
    if committed_steps:  # the updates of the NaN steps were skipped: the weights stayed finite
        model = export.load_checkpoint_model(checkpoint_layout.latest(root), tiny_config(run_dir))
        assert all(torch.isfinite(p).all() for p in model.parameters())


# -- export of non-finite weights ------------------------------------------------------------------

Poison = namedtuple("Poison", "tensor value")


@pytest.mark.parametrize(
    "poison",
    [
        # tied to lm_head.weight: NaN never equals its tied copy, which once read as an untie
        Poison("model.embed_tokens.weight", float("nan")),
        Poison("model.layers.1.mlp.down_proj.weight", float("inf")),
        Poison("model.norm.weight", float("-inf")),
    ],
    ids=lambda p: p.tensor,
)
def test_export_refuses_non_finite_weights_naming_them(demo_run, tmp_path, poison):
    config = tiny_config(demo_run)
    model = build_model(config)
    with torch.no_grad():
        dict(model.named_parameters())[poison.tensor].view(-1)[7] = poison.value
    folder = tmp_path / "step-00000008"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP "assumes" a single process: we mean it
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(folder), no_dist=True)
    (folder / checkpoint_layout.TRAINER_STATE).write_text('{"step": 8, "tokens": 4096}')
    with pytest.raises(UserError) as caught:
        export.export_checkpoint(
            folder, tmp_path / "hf", model_config=config, tokenizer_dir=demo_run / "tokenizer"
        )
    message = caught.value.message
    assert poison.tensor in message and "diverged" in message and "learning rate" in message
    assert "tie_word_embeddings" not in message
    assert not (tmp_path / "hf" / export.WEIGHTS).exists()


# -- a checkpoint disk that runs out of space -------------------------------------------------------

GB = 10**9
TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def short_write_after_enospc():
    """What torch's zip writer raises on a full disk: its own message, raised while handling
    the OSError (as seen on a real full tmpfs)."""
    try:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
        raise RuntimeError(TORCH_SHORT_WRITE) from None  # no cause; the OSError is its context


def short_write_alone():
    """The same error from a rank whose OSError did not travel with it."""
    raise RuntimeError(TORCH_SHORT_WRITE)


def input_output_error():
    raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("fail", "free_bytes", "says"),
    [
        (short_write_after_enospc, 12 * 10**6, "no space left on device at {root} (0.01 GB free)"),
        (short_write_alone, 3 * 10**6, "no space left on device at {root} (0.00 GB free)"),
        (short_write_alone, 500 * GB, "unexpected pos 704 vs 598"),  # plenty free: not a full disk
        (input_output_error, 500 * GB, "Input/output error"),
    ],
    ids=["enospc-context", "nearly-full", "roomy", "eio"],
)
def test_a_failed_save_says_no_space_when_the_disk_is_full(
    tmp_path, monkeypatch, async_save, fail, free_bytes, says
):
    monkeypatch.setenv("HANLM_FAULT_WRITE_ERRORS", "ENOSPC:1")  # the faulty writer, failing below
    monkeypatch.setattr(checkpoint, "_maybe_fail", fail)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        checkpoint.shutil, "disk_usage", lambda path: usage._replace(free=free_bytes)
    )
    root = tmp_path / "checkpoints"
    policy = checkpoint_layout.Policy(
        async_save=async_save, retries=0, backoff_s=0.0, max_consecutive_failures=1
    )
    manager = CheckpointManager(root, parallel.Dist(0, 1, 0, torch.device("cpu")), policy)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError) as caught:
        manager.save(1, model, optimizer, {"step": 1})
        manager.wait()
    assert says.format(root=root) in caught.value.message
    assert ("no space" in says) == ("no space" in caught.value.message)
    assert checkpoint_layout.latest(root) is None and not list(root.glob("step-*"))


# -- resuming at odd moments ----------------------------------------------------------------------


def test_a_run_resumed_at_its_final_checkpoint_keeps_the_validation_in_its_summary(run_dir):
    values = {"pretrain.max_steps": 2, "logging.eval_every": 2, "checkpoint.every": 2}
    finished = train(run_dir, **values)
    assert finished.val_loss is not None and finished.val_bpb is not None
    # killed between the final checkpoint and the stage marker
    (run_dir / "pretrain" / "stage.json").unlink()
    again = train(run_dir, **values)
    assert again.completed and (run_dir / "pretrain" / "stage.json").is_file()
    assert (again.val_loss, again.val_bpb) == (finished.val_loss, finished.val_bpb)
    summary = PretrainSummary.read(run_dir / "pretrain" / PretrainSummary.FILE)
    assert summary.val_loss == finished.val_loss
    assert [r["step"] for r in metrics(run_dir) if "loss" in r] == [1, 2]  # nothing logged twice


def test_the_first_loss_after_a_resume_averages_the_same_steps_as_an_unbroken_run(
    run_dir, tmp_path
):
    # one line every 2 steps, a checkpoint every step: a stop at step 1 is mid-window
    values = {"pretrain.max_steps": 2, "logging.log_every": 2, "checkpoint.every": 1}
    unbroken = tmp_path / "unbroken"
    shutil.copytree(run_dir, unbroken)
    train(unbroken, **values)
    train(run_dir, stop_after_steps=1, **values)
    train(run_dir, **values)
    assert losses(run_dir) == losses(unbroken)  # the average of steps 1 and 2, bit for bit
    assert sorted(losses(run_dir)) == [2]
