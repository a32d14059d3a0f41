"""`hanlm run` end to end on a tiny recipe: killed in the middle of pretraining, it finishes on the
next `hanlm run` without redoing the stages already complete, and writes a report card whose
sections all carry measured numbers and whose plots are images."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hanlm.data.decontam.outputs import DecontamReport
from hanlm.data.shards import ShardsManifest
from hanlm.evals.results import EvalResults
from hanlm.launch.torchrun import processes_below
from hanlm.train import checkpoint_layout
from hanlm.train.results import PretrainSummary

# The whole pipeline in about a minute: the demo world at 0.6 MB, the tiny model, short SFT
# and eval, and the comparison without the leaks (the demo recipe's decontam.compare_drop).
# Pretraining is long enough (in steps) to be killed half-way.
TINY_RUN = {
    "demo.size_mb": 0.6,  # the mirrored leaks take ~0.3 MB of it
    "corpus.part_chars": 40_000,
    "corpus.near_dedup": "false",
    "tokenizer.vocab_size": 1024,
    "tokenizer.heldout_docs": 20,
    "data_engine.workers": 1,
    "shards.val_fraction": 0.02,
    "preflight.storage_mb": 8,
    "preflight.matmul_seconds": 0.1,
    "preflight.data_seconds": 0.2,
    # a tiny model's steps on a loaded, shared machine: only a real fault may say NO-GO
    "preflight.max_comm_ratio": 1000,
    "preflight.max_save_fraction": 1000,
    "preflight.min_write_mb_s": 1,
    "preflight.max_fsync_ms": 60_000,
    "model.preset": "tiny",
    "pretrain.seq_len": 64,
    "pretrain.micro_batch": 4,  # one micro-batch a rank on 2 ranks, two on one
    "pretrain.global_batch_tokens": 512,
    "pretrain.max_steps": 120,
    "optimizer.warmup_steps": 5,
    "optimizer.lr": 1e-2,
    "logging.eval_every": 40,
    "logging.eval_batches": 2,
    "logging.log_every": 5,
    "checkpoint.every": 10,
    "sft.seq_len": 128,
    "sft.max_steps": 6,
    "sft.optimizer.warmup_steps": 1,
    "sft.heldout": 4,
    "sft.closure_max_tokens": 8,
    # the card with two variants beside `full-mean`: the field's setup (LoRA, rows frozen, not
    # initialised) and LoRA with the rows trained
    "sft.compare": '[{method = "lora", init = "none", train_new_token_rows = false}, '
    '{method = "lora", init = "mean"}]',
    "eval.limit": 12,
    "eval.max_new_tokens": 8,
}

STAGE_FOLDERS = ("corpus", "decontam", "tokenizer", "shards")


def _mirror(run_dir: Path) -> Path:
    """The run's [checkpoint] mirror, beside it: the field recipe sets one."""
    return run_dir.parent / "mirror"


def _args(run_dir: Path) -> list[str]:
    args = ["run", "--run-dir", str(run_dir)]  # torchrun takes a bare --run as its own
    for key, value in TINY_RUN.items():
        args += ["--set", f"{key}={value}"]
    return [*args, "--set", f"checkpoint.mirror={_mirror(run_dir)}"]


def _start_on_two_ranks(run_dir: Path, log: Path) -> subprocess.Popen:
    """`hanlm run` under `hanlm torchrun` with 2 CPU ranks, its output in `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hanlm", "torchrun", "--standalone", "--nproc-per-node", "2",
             "-m", "hanlm", *_args(run_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"},
        )  # fmt: skip


def _wait_for_checkpoint(process: subprocess.Popen, root: Path, log: Path, timeout=240) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = checkpoint_layout.latest(root) if root.is_dir() else None
        if found is not None:
            return found
        if process.poll() is not None:
            pytest.fail(f"hanlm run ended early ({process.returncode}): {log.read_text()}")
        time.sleep(0.05)
    _kill(process)
    pytest.fail("no pretraining checkpoint appeared")


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the agent and every rank (torchrun starts them in sessions of their own)."""
    for pid in [process.pid, *processes_below(process.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def interrupted_then_finished(tmp_path_factory):
    """Started on 2 ranks (the data stages run on rank 0 alone while rank 1 waits), killed once
    pretraining has a checkpoint, then run again in one process to the end."""
    run_dir = tmp_path_factory.mktemp("full_run")
    first_log = run_dir.parent / "first.log"
    process = _start_on_two_ranks(run_dir, first_log)
    first = _wait_for_checkpoint(process, run_dir / "pretrain" / "checkpoints", first_log)
    _kill(process)
    markers = {name: (run_dir / name / "stage.json").stat().st_mtime_ns for name in STAGE_FOLDERS}
    plan_written = (run_dir / "plan" / "plan.json").stat().st_mtime_ns
    killed_at = int(first.name.split("-")[1])

    second = subprocess.run(
        [sys.executable, "-m", "hanlm", *_args(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert second.returncode == 0, second.stderr[-3000:]
    return run_dir, markers, plan_written, killed_at, first_log.read_text(), second.stderr


def test_killed_run_finishes_without_redoing_complete_stages(interrupted_then_finished):
    run_dir, markers, plan_written, killed_at, _, log = interrupted_then_finished
    assert 0 < killed_at < TINY_RUN["pretrain.max_steps"]
    for name, mtime in markers.items():
        assert (run_dir / name / "stage.json").stat().st_mtime_ns == mtime, name
        assert re.search(rf"{name}: .*(up to date|skipped|complete)", log), name
    assert (run_dir / "plan" / "plan.json").stat().st_mtime_ns == plan_written
    # pretraining continued from the checkpoint the kill left, not from step 0
    summary = PretrainSummary.read(run_dir / "pretrain" / PretrainSummary.FILE)
    assert summary.step == TINY_RUN["pretrain.max_steps"] and summary.completed
    steps = [
        int(line.split('"step": ')[1].split(",")[0])
        for line in (run_dir / "pretrain" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps.count(TINY_RUN["logging.log_every"]) == 1  # the first steps ran once


def test_every_report_section_has_measured_numbers(interrupted_then_finished):
    run_dir = interrupted_then_finished[0]
    report = (run_dir / "report.md").read_text()
    sections = re.split(r"^## ", report, flags=re.M)[1:]
    assert len(sections) == 8
    for section in sections:
        assert "Not measured" not in section, section[:200]
        assert re.search(r"\d", section.split("\n", 1)[1])
    for title in ("Plan", "Preflight", "Corpus", "Pretraining", "Clean versus", "Chat answers",
                  "both directions", "Repetition"):  # fmt: skip
        assert title in report


def test_plots_open_as_images(interrupted_then_finished):
    import matplotlib.image

    run_dir = interrupted_then_finished[0]
    linked = re.findall(r"\]\((plots/[^)]+\.png)\)", (run_dir / "report.md").read_text())
    assert len(linked) >= 7
    for name in linked:
        image = matplotlib.image.imread(run_dir / name)
        assert image.shape[0] > 100 and image.shape[1] > 100


def test_the_comparison_without_the_leaks_runs_beside_and_is_skipped_when_finished(
    interrupted_then_finished,
):
    """The demo recipe keeps its contaminated documents and trains the same recipe once more
    without them (decontam.compare_drop): on the run's own corpus, with its own tokenizer (trained
    without the leaked documents, as a run that drops them would), shards of the cleaned corpus,
    pretraining and demo_qa eval; the card sets both side by side."""
    from hanlm.pipeline import run_stage
    from hanlm.stages.rundir import load_run_config

    run_dir, log = interrupted_then_finished[0], interrupted_then_finished[-1]
    sub = run_dir / "compare" / "drop"
    for name in ("demo", "corpus"):
        assert (sub / name).is_symlink() and (sub / name).resolve() == (run_dir / name).resolve()
    assert (sub / "tokenizer").is_dir() and not (sub / "tokenizer").is_symlink()
    report = DecontamReport.read(sub / "decontam" / DecontamReport.FILE)
    assert report.action == "drop" and report.documents_dropped > 0
    kept = json.loads((run_dir / "decontam" / "items.jsonl").read_text().splitlines()[0])
    assert kept == json.loads((sub / "decontam" / "items.jsonl").read_text().splitlines()[0])
    tokens = {d: ShardsManifest.read(d / "shards" / ShardsManifest.FILE) for d in (run_dir, sub)}
    assert tokens[run_dir].tokenizer_sha256 != tokens[sub].tokenizer_sha256
    assert tokens[sub].splits["train"].tokens < tokens[run_dir].splits["train"].tokens
    summary = PretrainSummary.read(sub / "pretrain" / PretrainSummary.FILE)
    assert summary.step == TINY_RUN["pretrain.max_steps"]
    record = EvalResults.read(sub / "eval" / EvalResults.FILE)
    assert list(record.tasks) == ["demo_qa"] and len(record.models) == 1
    assert "compare: the same recipe with decontam.action = drop" in log
    card = (run_dir / "report.md").read_text()
    assert "| dropped (compare/drop) | demo_qa | accuracy |" in card
    assert "demo_qa, item by item, the same items with minus without the leaked documents" in card

    markers = {p: p.stat().st_mtime_ns for p in sub.glob("*/stage.json")}
    assert len(markers) >= 4
    result = run_stage("compare", load_run_config(run_dir), run_dir)
    assert result["run"] == str(sub) and "eval" in result["stages"]
    assert {p: p.stat().st_mtime_ns for p in sub.glob("*/stage.json")} == markers


# every training of the run: its folder in the run, and its place under MIRROR/RUN/
TRAININGS = (
    "pretrain",
    "sft",
    "sft/ablation/lora-none-frozen",
    "sft/ablation/lora-mean-rows",
    "compare/drop/pretrain",
)


def test_each_training_mirrors_into_its_own_place(interrupted_then_finished):
    """One [checkpoint] mirror for pretraining, SFT and its variants and the comparison's
    pretraining: each copies into MIRROR/RUN/its folder, which holds only its own checkpoints
    (SFT used to restore pretraining's, and stop)."""
    run_dir = interrupted_then_finished[0]
    mirror = _mirror(run_dir)
    assert [p.name for p in mirror.iterdir()] == [run_dir.name]
    for folder in TRAININGS:
        local = checkpoint_layout.latest(run_dir / folder / "checkpoints")
        copies = checkpoint_layout.committed(mirror / run_dir.name / folder)
        assert copies and copies[-1].name == local.name, folder
        own = checkpoint_layout.read_trainer_state(local)["fingerprint"]
        assert {checkpoint_layout.read_trainer_state(c)["fingerprint"] for c in copies} == {own}


def test_each_training_is_restored_from_the_mirror_when_its_folder_is_gone(
    interrupted_then_finished, tmp_path
):
    """The run on a new host with the same run folder name and the mirror, its checkpoints
    lost: pretraining, each SFT variant and the comparison's pretraining restore their own
    last checkpoint from the mirror and finish from it, training no step again."""
    run_dir = interrupted_then_finished[0]
    copy = tmp_path / "new-host" / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True)
    logged = {}
    for folder in TRAININGS:
        shutil.rmtree(copy / folder / "checkpoints")
        logged[folder] = (copy / folder / "metrics.jsonl").read_text()
    for stage in ("pretrain", "sft", "compare/drop/pretrain"):
        (copy / stage / "stage.json").unlink()
    args = [a if a != str(run_dir) else str(copy) for a in _args(run_dir)]
    done = subprocess.run(
        [sys.executable, "-m", "hanlm", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for folder in TRAININGS:
        step = checkpoint_layout.latest(run_dir / folder / "checkpoints").name
        where = _mirror(run_dir) / run_dir.name / folder
        assert f"restored checkpoint {step} from the mirror {where}" in done.stderr, folder
        assert (copy / folder / "metrics.jsonl").read_text() == logged[folder], folder
        assert checkpoint_layout.latest(copy / folder / "checkpoints").name == step


def test_under_torchrun_data_stages_run_once_on_rank_0(interrupted_then_finished):
    """The first, killed, run had two ranks: the data stages ran on rank 0 alone while rank 1
    waited for them, and preflight used both."""
    log = interrupted_then_finished[4]
    assert len(re.findall(r"^corpus: .* documents", log, flags=re.M)) == 1, log[-3000:]
    assert len(re.findall(r"^shards: .* train tokens", log, flags=re.M)) == 1
    assert "preflight: 2 rank(s)" in log  # preflight itself uses both ranks
    # before the data stages, preflight's note on the missing shards says the run makes them
    flat = " ".join(log.split())
    assert "the run makes them after this check" in flat and "hanlm shards` first" not in flat


def _section(report: str, title: str) -> str:
    return next(s for s in re.split(r"^## ", report, flags=re.M) if s.startswith(title))


def test_card_says_why_answers_end_and_compares_the_reverse_gap(interrupted_then_finished):
    """Issue 20's lessons 2 and 3 in the card of the run: closure by variant beside <|eot|>'s rank and
    row norms, with a verdict that follows the measured rates; the reverse gap of the facts the
    corpus also stated object first beside the others', in the same model."""
    import json

    from hanlm.report.closure_section import CLOSURE_MARGIN

    run_dir = interrupted_then_finished[0]
    report = (run_dir / "report.md").read_text()
    closure = _section(report, "6. Chat answers")
    by_variant = json.loads((run_dir / "sft" / "summary.json").read_text())["closure_by_variant"]
    assert set(by_variant) == {"full-mean", "lora-none-frozen", "lora-mean-rows"}  # TINY_RUN's
    assert "median rank at answer ends" in closure and "trained rows' mean norm" in closure
    for name in ("lora-none-frozen", "lora-mean-rows"):
        check = json.loads((run_dir / "sft" / "ablation" / name / "closure.json").read_text())
        assert check["method"] == "lora" and check["variant"] == name
        rank = check["diagnosis"]["after"]["eot_rank"]
        assert f"{rank['median_rank']:,} (top-1 {rank['top1']:.0%})" in closure
        low, high = check["interval"]
        assert f"{check['rate']:.2f} [{low:.2f}, {high:.2f}]" in closure
    others = max(by_variant["full-mean"], by_variant["lora-mean-rows"])
    reproduced = others - by_variant["lora-none-frozen"] >= CLOSURE_MARGIN
    verdict = "failure, reproduced" if reproduced else "Not reproduced at demo size"
    assert verdict in closure
    # the verdict carries the numbers behind it: why the frozen rows closed as they did
    frozen = json.loads(
        (run_dir / "sft" / "ablation" / "lora-none-frozen" / "closure.json").read_text()
    )
    assert f"`lora-none-frozen` ended {frozen['closed']} of {frozen['total']}" in closure
    assert re.search(r"median rank at answer ends [\d,]+ \(top-1 \d+%\) → [\d,]+", closure)

    direction = _section(report, "7. Knowledge in both directions")
    samples = [json.loads(line) for line in (run_dir / "eval" / "samples.jsonl").open()]
    results = EvalResults.read(run_dir / "eval" / EvalResults.FILE).results
    for model, tasks in results.items():
        probed = [s for s in samples if s["task"] == "direction" and s["model"] == model]
        stated = sum(s["reverse_stated"] for s in probed)
        assert 0 < stated < len(probed)  # the demo recipe's reverse_share picks about half
        assert f"states {stated} of the {len(probed)} probed facts also object first" in direction
        scores = tasks["direction"]["full"]
        assert scores["gap/reverse_stated"].n == stated
        assert scores["gap/reverse_unstated"].n == len(probed) - stated
        for group, n in (("reverse stated", stated), ("reverse not stated", len(probed) - stated)):
            assert re.search(rf"\| {group} \| {n} \| -?\d+\.\d\d \| -?\d+\.\d\d \|", direction)


def test_a_run_directory_moved_elsewhere_is_still_up_to_date(demo_run, tmp_path):
    """Copied to another path with new file times (as `cp -r` or a transfer between hosts does),
    a finished run redoes nothing, and pretraining would take its checkpoints."""
    from conftest import DEMO_RUN_VALUES
    from hanlm import pipeline
    from hanlm.config import load_config
    from hanlm.files import read_json
    from hanlm.pipeline import run_pipeline
    from hanlm.stages.rundir import RunDir

    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(demo_run, moved, copy_function=shutil.copy)  # new paths, new times
    stages = ("demo", "corpus", "decontam", "tokenizer", "shards")
    before = {s: read_json(moved / s / "stage.json") for s in stages}
    cfg = load_config(values=DEMO_RUN_VALUES)
    run_pipeline(cfg, moved, until="shards")
    assert {s: read_json(moved / s / "stage.json") for s in stages} == before
    here, there = RunDir(moved), RunDir(demo_run)
    assert pipeline.current_fingerprint("pretrain", cfg, here) == (
        pipeline.current_fingerprint("pretrain", cfg, there)
    )


def test_sft_knows_the_runs_own_export_after_a_move(tmp_path):
    from hanlm.stages import sft
    from hanlm.stages.rundir import RunDir

    run = tmp_path / "a" / "run"
    (run / "pretrain" / "hf").mkdir(parents=True)
    (run / "pretrain" / "hf" / "model.safetensors").write_bytes(b"weights")
    moved = tmp_path / "b" / "run"
    shutil.copytree(run, moved)  # copy2: the times stay, the path changes
    fp = sft._hf_source(run / "pretrain" / "hf", RunDir(run)).fingerprint
    assert sft._hf_source(moved / "pretrain" / "hf", RunDir(moved)).fingerprint == fp
    # a folder outside the run is still known by its own path
    other = RunDir(tmp_path / "other")
    outside = sft._hf_source(run / "pretrain" / "hf", other).fingerprint
    assert sft._hf_source(moved / "pretrain" / "hf", other).fingerprint != outside
