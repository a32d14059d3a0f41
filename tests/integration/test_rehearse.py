"""`hanlm rehearse` on CPU: the demo recipe rehearsed end to end in about a minute (every stage
with its figures, pretraining stopped in a save and resumed to the same bits, one request to
`hanlm serve`), nothing written outside RUN/rehearsal/, the plan taking the measured speed, and
a `hanlm run` afterwards running every stage; planted host faults give `not ready` naming the
stage, exit 69, and nothing written outside the rehearsal's folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hanlm import exit_status
from hanlm.plan.measured import RehearsalRecord

ENV = {**os.environ, "COLUMNS": "200", "PYTHONWARNINGS": "ignore"}
# a tiny model's steps on a loaded, shared machine: only a planted fault may say NO-GO
HOST = (
    "preflight.max_comm_ratio=1000", "preflight.max_save_fraction=1000",
    "preflight.min_write_mb_s=1", "preflight.max_fsync_ms=60000",
)  # fmt: skip


def rehearse(run: Path, *settings: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "hanlm", "rehearse", "--run-dir", str(run)]
    for setting in (*HOST, *settings):
        args += ["--set", setting]
    return subprocess.run(args, capture_output=True, text=True, timeout=900, env=ENV)


def rehearse_here(cli, run: Path, *settings: str):
    """`hanlm rehearse` in this process: the planted faults stop before its child processes."""
    settings = (*HOST, *settings)
    return cli("rehearse", "--run-dir", run, *(a for s in settings for a in ("--set", s)))


# the demo recipe with a tiny model: every stage as the demo has it, quicker
TINY = ("model.preset=tiny", "pretrain.seq_len=64", "pretrain.micro_batch=4")


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    """The demo recipe (its model tiny) rehearsed, with a checkpoint mirror beside the run (as
    the field recipe has one)."""
    run = tmp_path_factory.mktemp("rehearsed") / "demo"
    # an earlier rehearsal's copy in the mirror: gone once this one starts (what the mirror
    # holds afterwards, this one wrote)
    stale = run.parent / "mirror" / "demo" / "rehearsal" / "pretrain" / "step-00000099"
    stale.mkdir(parents=True)
    (stale / "manifest.json").write_text("{}")
    done = rehearse(run, *TINY, f"checkpoint.mirror={run.parent / 'mirror'}")
    assert done.returncode == 0, done.stderr[-4000:]
    return run, RehearsalRecord.read(run / "rehearsal" / RehearsalRecord.FILE), done.stderr


def test_the_demo_recipe_rehearses_every_stage_with_its_figures(rehearsed):
    _, record, log = rehearsed
    assert record.ready and record.failed_stage is None and record.fault is None
    status = {s.name: s.status for s in record.stages}
    assert status == {
        "plan": "ok", "preflight": "ok", "corpus": "ok", "decontam": "ok", "tokenizer": "ok",
        "shards": "ok", "pretrain": "ok", "mirror": "ok", "resume": "ok",
        "export": "ok", "sft": "ok", "serve": "ok", "eval": "ok", "report": "ok",
    }  # fmt: skip
    figures = {s.name: s.figures for s in record.stages}
    for stage in ("corpus", "decontam", "shards"):
        assert figures[stage]["mb_per_s_per_core"] > 0
    pretrain = figures["pretrain"]
    assert pretrain["timed_steps"] >= 20 and pretrain["tokens_per_s"] > 0
    assert 0 < pretrain["mfu"] <= 1
    assert pretrain["peak_memory_gb"] > 0 and pretrain["planned_memory_gb"] > 0
    assert pretrain["checkpoint_write_s"] > 0
    resume = figures["resume"]
    assert resume["agree"] and resume["promise"] == "bit for bit"
    assert resume["max_loss_difference"] == 0.0 and resume["steps_compared"] >= 5
    assert resume["resumed_from_step"] < resume["stopped_in_save_of_step"]
    assert figures["sft"]["tokens_per_s"] > 0 and figures["eval"]["items_per_s"] > 0
    assert figures["serve"]["answer_s"] > 0
    assert record.shapes["model"] == "tiny" and record.shapes["gpu"] == "cpu"
    assert "ready" in log and "rehearsal: 1 x cpu" in log


def test_the_projection_follows_from_the_measured_speed(rehearsed):
    _, record, _ = rehearsed
    p = record.projection
    measured = next(s for s in record.stages if s.name == "pretrain").figures["tokens_per_s"]
    assert p.measured_tokens_per_s == measured
    assert p.tokens == 240 * 2048  # the demo recipe's 240 steps of 2,048 tokens
    expected = p.tokens / measured / 3600 * p.gpus
    assert abs(p.gpu_hours - expected) <= 0.02 * expected
    assert p.planned_gpu_hours > 0 and p.planned_tokens_per_s > 0
    assert p.total_hours == pytest.approx(p.pretrain_hours + p.data_hours)


def test_nothing_is_written_outside_the_rehearsal_and_a_run_afterwards_runs_every_stage(
    rehearsed, tmp_path
):
    """The run folder holds the rehearsal alone: no stage of the run is marked finished, so a
    `hanlm run` afterwards runs every stage (its plan taking the rehearsal's measured speed)."""
    import shutil

    from hanlm.config import load_config
    from hanlm.pipeline import run_pipeline

    run, _, _ = rehearsed
    assert sorted(p.name for p in run.iterdir()) == ["rehearsal"]
    # the mirror holds the rehearsal's trainings alone, under its own place
    mirror = run.parent / "mirror"
    assert not list(mirror.rglob("step-00000099"))  # the earlier rehearsal's copy is gone
    places = {p.parent.relative_to(mirror).as_posix() for p in mirror.rglob("latest")}
    assert places == {
        "demo/rehearsal/pretrain", "demo/rehearsal/resume/pretrain", "demo/rehearsal/sft"
    }  # fmt: skip
    copy = tmp_path / "demo"
    shutil.copytree(run, copy, symlinks=True)
    run_pipeline(load_config("demo", overrides=list(TINY)), copy, until="preflight")
    for stage in ("plan", "preflight"):
        assert (copy / stage / "stage.json").is_file()
    assert "measured: hanlm rehearse on cpu" in (copy / "plan" / "plan.json").read_text()


def test_hanlm_plan_uses_the_rehearsals_speed_and_says_so(rehearsed, cli):
    run, record, _ = rehearsed
    tiny = [a for setting in TINY for a in ("--set", setting)]
    result = cli("plan", "--run", run, "--config", "demo", "--json", *tiny)
    assert result.code == 0, result.err
    import json

    timing = json.loads(result.out)["time"]
    assert timing["mfu_source"].startswith("measured: hanlm rehearse on cpu")
    assert timing["tokens_per_s"] == pytest.approx(record.projection.measured_tokens_per_s)
    # another micro-batch is other shapes: the assumed MFU again
    other = cli("plan", "--run", run, "--config", "demo", "--json", *tiny,
                "--set", "pretrain.micro_batch=8")  # fmt: skip
    assert not json.loads(other.out)["time"]["mfu_source"].startswith("measured:")


def test_the_report_card_shows_the_rehearsal(rehearsed):
    from hanlm.report.plan_section import preflight_section
    from hanlm.stages.report import run_files
    from hanlm.stages.rundir import RunDir

    run, record, _ = rehearsed
    card = preflight_section(run_files(RunDir(run)))
    assert "**Rehearsal**" in card and "**ready**" in card
    assert "| resume | ok |" in card and "agree bit for bit" in card
    assert f"{record.projection.measured_tokens_per_s:,.0f} tokens/s" in card


def test_an_unwritable_mirror_is_a_host_fault_named_with_nothing_written_elsewhere(tmp_path, cli):
    blocker = tmp_path / "a-file"  # a mirror under a file: no one can write there, root neither
    blocker.write_text("not a folder")
    run = tmp_path / "demo"
    # no retries: each copy would be tried again with backoff before the verdict
    mirror = (f"checkpoint.mirror={blocker / 'mirror'}", "checkpoint.retries=0")
    done = rehearse_here(cli, run, *TINY, *mirror)
    assert done.code == exit_status.HOST_REJECTED, done.err[-3000:]
    record = RehearsalRecord.read(run / "rehearsal" / RehearsalRecord.FILE)
    assert record.verdict == "not ready" and record.failed_stage == "mirror"
    assert record.fault == "host" and "mirror" in record.error and record.fix
    status = {s.name: s.status for s in record.stages}
    assert status["pretrain"] == "ok" and status["mirror"] == "failed"
    assert status["export"] == status["report"] == "not run"
    assert sorted(p.name for p in run.iterdir()) == ["rehearsal"]
    assert blocker.read_text() == "not a folder"
    assert "not ready: mirror failed" in " ".join(done.err.split())


def test_a_micro_batch_that_cannot_fit_is_refused_before_pretraining(tmp_path, cli):
    run = tmp_path / "demo"
    done = rehearse_here(
        cli, run, "pretrain.micro_batch=65536", "pretrain.global_batch_tokens=16777216"
    )
    assert done.code == exit_status.HOST_REJECTED, done.err[-3000:]
    record = RehearsalRecord.read(run / "rehearsal" / RehearsalRecord.FILE)
    assert record.failed_stage == "pretrain" and record.fault == "host"
    assert "micro-batch 65536" in record.error and "activation_checkpointing" in record.fix
    assert not (run / "rehearsal" / "pretrain" / "metrics.jsonl").exists()  # never started
    assert sorted(p.name for p in run.iterdir()) == ["rehearsal"]


def test_a_rank_whose_sft_fails_under_torchrun_is_named(tmp_path):
    """Two ranks, as the run would use them; SFT fails on rank 1 once the ranks have joined
    (a planted failure): not ready, naming sft, the stages after it not run."""
    run = tmp_path / "demo"
    args = [sys.executable, "-m", "hanlm", "torchrun", "--standalone", "--nproc-per-node", "2",
            "-m", "hanlm", "rehearse", "--run-dir", str(run)]  # fmt: skip
    for setting in (*HOST, *TINY, "sft.batch_rows=4"):
        args += ["--set", setting]
    env = {**ENV, "OMP_NUM_THREADS": "1", "HANLM_FAULT_TRAINING": "sft:1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode != 0, done.stderr[-3000:]
    record = RehearsalRecord.read(run / "rehearsal" / RehearsalRecord.FILE)
    assert record.world_size == 2 and record.verdict == "not ready"
    assert record.failed_stage == "sft", record.error
    status = {s.name: s.status for s in record.stages}
    assert status["pretrain"] == status["resume"] == "ok" and status["sft"] == "failed"
    # before it, FSDP2 on 2 ranks stopped hard in a save resumed to the same bits
    resume = next(s for s in record.stages if s.name == "resume").figures
    assert resume["agree"] and resume["max_loss_difference"] == 0.0
    assert status["serve"] == status["eval"] == status["report"] == "not run"
    assert sorted(p.name for p in run.iterdir()) == ["rehearsal"]
