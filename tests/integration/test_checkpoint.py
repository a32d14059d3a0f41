"""Checkpoints under crashes, bad storage and preemption; retention and the mirror. (A run
killed while saving resumes to the same bits: test_resume_exact.py.)"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import (
    TINY_PRETRAIN,
    assert_user_error,
    checkpoint_weights,
    copy_data_run,
    losses,
)
from hanlm import exit_status
from hanlm.config import load_config
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config
from hanlm.train import checkpoint_layout, checkpoint_mirror
from hanlm.train.checkpoint_layout import committed, latest, verify

TINY = {**TINY_PRETRAIN, "pretrain.max_steps": 10, "logging.eval_every": 0}
TINY.update({"checkpoint.every": 2, "checkpoint.backoff_s": 0.0})


@pytest.fixture
def run_dir(demo_run, tmp_path):
    return copy_data_run(demo_run, tmp_path / "run")


def train(run_dir, **extra):
    cfg = load_run_config(run_dir, values={**TINY, **extra})
    return run_stage("pretrain", cfg, run_dir)


def ckpt_root(run_dir):
    return run_dir / "pretrain" / "checkpoints"


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    """The model tensors of the newest checkpoint, read back through DCP."""
    return checkpoint_weights(latest(ckpt_root(run_dir)))


def test_commit_writes_a_verified_manifest_and_moves_latest(run_dir):
    train(run_dir)
    root = ckpt_root(run_dir)
    assert (root / "latest").read_text().strip() == "step-00000010"
    path = latest(root)
    assert verify(path) is None
    manifest = json.loads((path / "manifest.json").read_text())
    assert "trainer.json" in manifest["files"] and any(
        f.endswith(".distcp") for f in manifest["files"]
    )
    assert not list(root.glob("*.incomplete"))
    # A damaged newest checkpoint is skipped in favour of the previous one.
    shard = next(path.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    assert verify(path) and "checksum" in verify(path)


def test_retention_keeps_last_k_and_every_mth(run_dir):
    train(
        run_dir,
        **{"checkpoint.every": 1, "checkpoint.keep_last": 2, "checkpoint.keep_every": 4},
    )
    steps = [int(p.name.split("-")[1]) for p in committed(ckpt_root(run_dir))]
    assert steps == [4, 8, 9, 10]


def test_damaged_latest_falls_back_and_training_reproduces(run_dir, tmp_path):
    whole = tmp_path / "whole"
    shutil.copytree(run_dir, whole)
    train(whole)
    cfg = load_run_config(run_dir, values=TINY)
    run_stage("pretrain", cfg, run_dir, stop_after_steps=6)
    root = ckpt_root(run_dir)
    six = latest(root)
    assert six.name == "step-00000006"
    next(six.glob("*.distcp")).write_bytes(b"torn write")
    run_stage("pretrain", cfg, run_dir)  # resumes from step 4, the newest good one
    assert losses(run_dir) == losses(whole)
    for name, tensor in final_weights(whole).items():
        assert torch.equal(final_weights(run_dir)[name], tensor), name


@pytest.mark.parametrize("error", ["ENOSPC", "EIO", "EROFS"])
def test_failed_writes_are_retried_and_training_goes_on(run_dir, monkeypatch, error):
    # Two failures, three retries: the save succeeds on a retry.
    monkeypatch.setenv("HANLM_FAULT_WRITE_ERRORS", f"{error}:2")
    summary = train(run_dir, **{"checkpoint.async_save": False})
    assert summary.completed
    assert latest(ckpt_root(run_dir)).name == "step-00000010"
    assert os.environ["HANLM_FAULT_WRITE_ERRORS"] == f"{error}:0"


def test_persistent_failure_stops_cleanly_and_the_last_good_one_loads(run_dir, monkeypatch, cli):
    cfg = load_run_config(run_dir, values=TINY)
    run_stage("pretrain", cfg, run_dir, stop_after_steps=4)
    good = latest(ckpt_root(run_dir))
    monkeypatch.setenv("HANLM_FAULT_WRITE_ERRORS", "ENOSPC:1000")
    args = ["pretrain", "--run", run_dir]
    for key, value in {
        **TINY,
        "checkpoint.retries": 1,
        "checkpoint.max_consecutive_failures": 2,
    }.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    result = cli(*args)
    assert_user_error(result, "could not be written", "resumes")
    assert latest(ckpt_root(run_dir)) == good and verify(good) is None
    assert not list(ckpt_root(run_dir).glob("*.incomplete"))
    monkeypatch.delenv("HANLM_FAULT_WRITE_ERRORS")
    assert train(run_dir).completed  # the run continues from the good checkpoint


def test_async_failure_is_reported_and_retried(run_dir, monkeypatch):
    monkeypatch.setenv("HANLM_FAULT_WRITE_ERRORS", "EIO:1")
    summary = train(run_dir, **{"checkpoint.async_save": True, "checkpoint.retries": 0})
    assert summary.completed
    assert [int(p.name.split("-")[1]) for p in committed(ckpt_root(run_dir))][-1] == 10


def test_mirror_copies_and_resume_starts_from_it(run_dir, tmp_path):
    cfg = load_run_config(run_dir, values={**TINY, "checkpoint.mirror": str(tmp_path / "mirror")})
    mirror = tmp_path / "mirror" / run_dir.name / "pretrain"  # the run's pretraining's place
    run_stage("pretrain", cfg, run_dir, stop_after_steps=4)
    assert (mirror / "latest").read_text().strip() == "step-00000004"
    assert verify(mirror / "step-00000004") is None
    shutil.rmtree(ckpt_root(run_dir))  # the primary disk is gone
    run_stage("pretrain", cfg, run_dir)
    assert sorted(losses(run_dir)) == list(range(1, 11))
    assert (mirror / "latest").read_text().strip() == "step-00000010"
    # the mirror keeps what the primary keeps (keep_last 3 of the saves every 2 steps)
    mirrored = sorted(p.name for p in mirror.glob("step-*"))
    assert mirrored == [p.name for p in committed(ckpt_root(run_dir))]
    assert mirrored == ["step-00000006", "step-00000008", "step-00000010"]


def _spawn(run_dir, extra_env=None, **settings):
    args = [sys.executable, "-m", "hanlm", "pretrain", "--run", str(run_dir)]
    for key, value in {**TINY, **settings}.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(extra_env or {})}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _wait_for_step(run_dir, step, proc, timeout=120):
    metrics = run_dir / "pretrain" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= step:
            return
        time.sleep(0.05)


def test_sigterm_saves_and_exits_75(run_dir):
    proc = _spawn(run_dir, **{"pretrain.max_steps": 400, "checkpoint.every": 1000})
    _wait_for_step(run_dir, 3, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == exit_status.STOPPED, err[-2000:]
    assert "preempted" in err
    stopped = latest(ckpt_root(run_dir))
    step = int(stopped.name.split("-")[1])
    assert 3 <= step < 400 and verify(stopped) is None
    assert json.loads((stopped / "trainer.json").read_text())["step"] == step


def test_policy_defaults_match_the_config():
    assert checkpoint_layout.Policy().async_save is load_config().checkpoint.async_save


# -- the mirror: no nesting on fsspec targets, the primary's retention, verified restores -------


def _committed_folder(root, step: int, fingerprint: str = "model-a"):
    """A committed checkpoint folder as _commit leaves it: files in a subfolder too, a manifest."""
    folder = checkpoint_layout.step_dir(root, step)
    (folder / "sub").mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(bytes([step]) * 1000)
    (folder / "sub" / "extra.bin").write_bytes(b"x" * step)
    (folder / "trainer.json").write_text(json.dumps({"step": step, "fingerprint": fingerprint}))
    checkpoint_layout.write_manifest(folder)
    return folder


def _tree(fs, base) -> set[str]:
    """Every file under `base` (fsspec or local), relative to it."""
    if fs is None:
        return {str(p.relative_to(base)) for p in Path(base).rglob("*") if p.is_file()}
    prefix = base.rstrip("/") + "/"
    return {p[len(prefix) :] for p in fs.find(base)}


@pytest.fixture(params=["folder", "file-url", "memory-url"])
def mirror_url(request, tmp_path):
    if request.param == "folder":
        yield str(tmp_path / "mirror")
    elif request.param == "file-url":
        yield f"file://{tmp_path / 'mirror'}"
    else:
        pytest.importorskip("fsspec")
        url = f"memory://hanlm-test/{tmp_path.name}"
        yield url
        fs, base = checkpoint_mirror.file_system(url)
        if fs.exists(base):
            fs.rm(base, recursive=True)


def test_mirror_keeps_the_layout_and_the_retention_and_restores(mirror_url, tmp_path):
    primary = tmp_path / "primary"
    policy = checkpoint_layout.Policy(keep_last=2, keep_every=2, backoff_s=0.0, mirror=mirror_url)
    fs, base = checkpoint_mirror.file_system(mirror_url)
    one = _committed_folder(primary, 1)
    files = {f"{one.name}/{p}" for p in _tree(None, one)}
    checkpoint_mirror.copy(one, policy)
    checkpoint_mirror.copy(one, policy)  # the same step again: replaced, not nested
    assert _tree(fs, base) == files | {"latest"}
    for step in range(2, 6):
        checkpoint_mirror.copy(_committed_folder(primary, step), policy)
    kept = {p.split("/")[0] for p in _tree(fs, base)} - {"latest"}
    assert kept == {"step-00000002", "step-00000004", "step-00000005"}
    assert kept == {
        checkpoint_layout.step_dir(primary, s).name
        for s in checkpoint_layout.retained([1, 2, 3, 4, 5], policy)
    }

    restored = tmp_path / "restored"
    (restored / "step-00000005").mkdir(parents=True)  # a save of that step cut short here
    (restored / "step-00000005" / "__0_0.distcp").write_bytes(b"torn")
    checkpoint_mirror.restore(mirror_url, restored)
    assert latest(restored).name == "step-00000005" and verify(latest(restored)) is None
    assert _tree(None, latest(restored)) == _tree(None, checkpoint_layout.step_dir(primary, 5))
    assert not list(restored.glob("*.incomplete"))


def test_trainings_sharing_a_mirror_keep_restore_and_prune_only_their_own(mirror_url, tmp_path):
    """One [checkpoint] mirror for two runs and two trainings each: every training copies into
    its own place, its retention prunes only there, a restore reads only there, and a copy made
    by another model, data or seed (a second run of the same name) is never restored."""
    places = ["a/pretrain", "a/sft", "b/pretrain", "a/compare/drop/pretrain"]
    for i, where in enumerate(places):
        policy = checkpoint_layout.Policy(
            keep_last=1, backoff_s=0.0, mirror=checkpoint_mirror.place(mirror_url, where)
        )
        for step in (i + 1, i + 10):
            checkpoint_mirror.copy(_committed_folder(tmp_path / where, step, where), policy)
    fs, base = checkpoint_mirror.file_system(mirror_url)
    for i, where in enumerate(places):
        assert _tree(fs, f"{base}/{where}") >= {"latest", f"step-{i + 10:08d}/trainer.json"}
        assert not any(p.startswith(f"step-{i + 1:08d}") for p in _tree(fs, f"{base}/{where}"))
        restored = tmp_path / "restored" / where
        restored.mkdir(parents=True)
        checkpoint_mirror.restore(checkpoint_mirror.place(mirror_url, where), restored, where)
        assert latest(restored).name == f"step-{i + 10:08d}"
        assert json.loads((latest(restored) / "trainer.json").read_text())["fingerprint"] == where
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    checkpoint_mirror.restore(checkpoint_mirror.place(mirror_url, "a/sft"), stranger, "a/pretrain")
    assert latest(stranger) is None and not list(stranger.iterdir())


def test_a_damaged_mirror_copy_is_not_restored(mirror_url, tmp_path):
    policy = checkpoint_layout.Policy(backoff_s=0.0, mirror=mirror_url)
    checkpoint_mirror.copy(_committed_folder(tmp_path / "primary", 7), policy)
    fs, base = checkpoint_mirror.file_system(mirror_url)
    shard = f"{base}/step-00000007/__0_0.distcp"
    if fs is None:
        Path(shard).write_bytes(b"torn")
    else:
        fs.pipe(shard, b"torn")
    restored = tmp_path / "restored"
    restored.mkdir()
    checkpoint_mirror.restore(mirror_url, restored)
    assert latest(restored) is None and not list(restored.iterdir())


def test_an_unfinished_remote_copy_is_not_taken_for_a_checkpoint(tmp_path):
    """A remote copy cut short before its manifest: the previous committed copy is restored."""
    pytest.importorskip("fsspec")
    url = f"file://{tmp_path / 'mirror'}"
    policy = checkpoint_layout.Policy(backoff_s=0.0, mirror=url)
    checkpoint_mirror.copy(_committed_folder(tmp_path / "primary", 3), policy)
    cut = tmp_path / "mirror" / "step-00000004"
    cut.mkdir()
    (cut / "__0_0.distcp").write_bytes(b"half")
    (tmp_path / "mirror" / "latest").write_text("step-00000004\n")
    restored = tmp_path / "restored"
    restored.mkdir()
    checkpoint_mirror.restore(url, restored)
    assert latest(restored).name == "step-00000003"


def test_a_run_folder_has_one_place_however_a_command_names_it(tmp_path):
    """The mirror place of a run inside a run is read from its path: `hanlm run`'s comparison
    and `hanlm pretrain --run-dir RUN/compare/drop` restore from the same place."""
    from hanlm.stages.rundir import RunDir

    run = RunDir(tmp_path / "runs" / "ko13b")
    assert run.pretrain.place == "ko13b/pretrain"
    assert run.comparison("drop").pretrain.place == "ko13b/compare/drop/pretrain"
    assert RunDir(tmp_path / "runs/ko13b/compare/drop").place == "ko13b/compare/drop"
    assert run.rehearsal.sft.place == "ko13b/rehearsal/sft"
    assert RunDir(run.rehearsal.root / "resume").pretrain.place == "ko13b/rehearsal/resume/pretrain"
    assert RunDir(run.rehearsal.root / "tune" / "mb4").place == "ko13b/rehearsal/tune/mb4"
    assert run.sft.ablation("lora-mean-rows").place == "ko13b/sft/ablation/lora-mean-rows"
