"""Dirty versus clean with bootstrap intervals (hanlm.evals.contamination), and the report
card's contamination section: the intervals, what they say in words, and the comparison with
the same recipe trained without the contaminated documents."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hanlm.data.decontam.outputs import DecontamReport
from hanlm.evals import contamination
from hanlm.evals.results import EvalResults
from hanlm.report.contamination_section import contamination_section
from hanlm.report.run_files import RunFiles


def test_a_real_gap_is_told_from_noise():
    clean = [0.0, 1.0] * 60  # at chance
    dirty = [1.0] * 30 + [0.0] * 10  # memorised: 0.75
    gaps = contamination.dirty_clean_gap(clean, dirty)
    assert gaps["clean"].value == pytest.approx(0.5) and not gaps["clean"].excludes(0.5)
    assert gaps["dirty"].value == pytest.approx(0.75)
    assert gaps["gap"].value == pytest.approx(0.25) and gaps["gap"].low > 0
    # the same two splits drawn from one distribution: the gap's interval holds 0
    rng = np.random.default_rng(1)
    same = contamination.dirty_clean_gap(rng.random(120) < 0.6, rng.random(80) < 0.6)
    assert same["gap"].low < 0 < same["gap"].high


def test_intervals_are_fixed_by_the_seed_and_cover_the_mean():
    rng = np.random.default_rng(0)
    clean, dirty = rng.normal(0, 1, 150), rng.normal(0.5, 1, 60)
    first = contamination.dirty_clean_gap(clean, dirty)
    assert first == contamination.dirty_clean_gap(clean, dirty)  # seed 0 by default
    other = contamination.dirty_clean_gap(clean, dirty, seed=1)
    assert other["gap"] != first["gap"]
    for name, values in (("clean", clean), ("dirty", dirty)):
        interval = first[name]
        assert interval.low < values.mean() < interval.high and interval.count == len(values)
        # about two standard errors each side, as a 95% interval of a mean should be
        half = (interval.high - interval.low) / 2
        assert half == pytest.approx(1.96 * values.std(ddof=1) / np.sqrt(len(values)), rel=0.2)
    wider = contamination.dirty_clean_gap(clean, dirty, confidence=0.99)
    assert wider["gap"].high - wider["gap"].low > first["gap"].high - first["gap"].low


def test_bad_splits_and_settings_are_refused():
    with pytest.raises(ValueError, match="both splits"):
        contamination.dirty_clean_gap([], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        contamination.dirty_clean_gap([1.0], [1.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        contamination.dirty_clean_gap([1.0], [1.0], resamples=0)


def test_scores_split_by_the_status_each_sample_carries():
    samples = [
        {"contamination": "clean", "scores": {"acc": 1.0}},
        {"contamination": "dirty", "scores": {"acc": 0.0}},
        {"contamination": "partial", "scores": {"acc": 1.0}},  # any overlap counts as dirty
        {"contamination": None, "scores": {"acc": 1.0}},  # not in the report: neither
        {"contamination": "clean", "scores": {"macro_f1": 1.0}},  # no such score
    ]
    assert contamination.scores_by_split(samples, "acc") == {"clean": [1.0], "dirty": [0.0, 1.0]}


# --- the report card -----------------------------------------------------------------------------


def _samples(model: str, seed: int, clean_acc: float, dirty_acc: float) -> list[dict]:
    """demo_qa samples of one model: 120 clean and 80 dirty items at the given accuracies."""
    rng = np.random.default_rng(seed)
    rows = []
    for status, n, acc in (("clean", 120, clean_acc), ("dirty", 80, dirty_acc)):
        for i in range(n):
            right = bool(rng.random() < acc)
            margin = float(rng.normal(1.0 if right else -1.0, 0.5))
            rows.append(
                {
                    "model": model,
                    "task": "demo_qa",
                    "item_id": f"{status}-{i}",
                    "loglikelihoods": [0.0, margin],
                    "prediction": int(right),
                    "gold": 1,
                    "contamination": status,
                    "scores": {"acc": float(right), "gold_margin": margin},
                }
            )
    return rows


def _files(
    tmp_path: Path, samples: list[dict], compared: list[dict] | None, action_sources=()
) -> RunFiles:
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "decontam").mkdir()
    EvalResults(
        models=[], model_dirs={}, tasks={}, contamination=None, contamination_splits=None,
        results={}, counts={}, seconds=0.0, fingerprint="test",
    ).write(run / "eval" / EvalResults.FILE)  # fmt: skip
    lines = "".join(json.dumps(s) + "\n" for s in samples)
    (run / "eval" / "samples.jsonl").write_text(lines)
    DecontamReport(
        benchmarks={}, ngram=13, dirty_threshold=0.5, clean_threshold=0.1, action="keep",
        documents_scanned=0, characters_scanned=0, bytes_scanned=0, records_skipped=0,
        documents_flagged=0, scan_seconds=0.0, inputs=[], mode="run",
        action_sources=list(action_sources),
    ).write(run / "decontam" / DecontamReport.FILE)  # fmt: skip
    compare = run / "compare" / "drop" / "eval" / "samples.jsonl"
    if compared is not None:
        compare.parent.mkdir(parents=True)
        compare.write_text("".join(json.dumps(s) + "\n" for s in compared))
    missing = run / "missing.json"
    return RunFiles(
        name="run", root=run, plots=run / "plots", config=missing, plan=missing,
        preflight=missing, corpus_stats=missing, decontam_report=run / "decontam" / "report.json",
        decontam_items=missing, planted=missing, pretrain_metrics=missing,
        pretrain_summary=run / "pretrain" / "summary.json", sft_metrics=missing, closure=missing,
        sft_summary=missing, ablation_closure=lambda variant: missing, audit=missing,
        eval_results=run / "eval" / "results.json", eval_samples=run / "eval" / "samples.jsonl",
        export_folder="hf", compare_eval_samples=compare,
    )  # fmt: skip


def test_card_shows_the_gap_with_intervals_and_the_comparison(tmp_path):
    kept = _samples("run/pretrain", 0, clean_acc=0.65, dirty_acc=0.95)
    dropped = _samples("drop/pretrain", 1, clean_acc=0.65, dirty_acc=0.65)
    text = contamination_section(_files(tmp_path, kept, dropped))
    gaps = contamination.dirty_clean_gap(*contamination.scores_by_split(kept, "acc").values())
    clean, dirty, gap = gaps["clean"], gaps["dirty"], gaps["gap"]
    row = (
        f"| pretrain | demo_qa | accuracy | {clean.value:.3f} [{clean.low:.3f}, {clean.high:.3f}] "
        f"| {dirty.value:.3f} [{dirty.low:.3f}, {dirty.high:.3f}] "
        f"| {gap.value:+.3f} [{gap.low:+.3f}, {gap.high:+.3f}] |"
    )
    assert row in text
    assert "clean accuracy" in text and "is above chance (0.50)" in text
    assert "contamination inflates accuracy" in text
    assert "| kept (this run) | demo_qa | accuracy |" in text
    assert "| dropped (compare/drop) | demo_qa | log-likelihood margin |" in text
    assert "without them" in text and "at the clean level" in text
    assert "2,000 resamples, seed 0" in text
    assert (tmp_path / "run" / "plots" / "clean_vs_dirty.png").is_file()


@pytest.mark.parametrize(
    ("dropped_dirty_acc", "verdict"),
    [
        (0.65, "at the clean level"),
        (0.95, "still above the clean level"),
        (0.25, "below the clean level: the leaked items happen to be harder ones"),
    ],
)
def test_card_says_where_dirty_items_land_without_the_leaks(tmp_path, dropped_dirty_acc, verdict):
    kept = _samples("run/pretrain", 0, clean_acc=0.65, dirty_acc=0.95)
    dropped = _samples("drop/pretrain", 1, clean_acc=0.65, dirty_acc=dropped_dirty_acc)
    text = contamination_section(_files(tmp_path, kept, dropped))
    (line,) = [line for line in text.splitlines() if "without them" in line]
    assert verdict in line, line


def test_card_says_when_nothing_is_measured(tmp_path):
    flat = _samples("run/pretrain", 2, clean_acc=0.5, dirty_acc=0.5)
    text = contamination_section(_files(tmp_path, flat, None))
    assert "is not above chance" in text
    assert "no difference between dirty and clean items beyond the noise" in text
    assert "No comparison without the contaminated documents" in text


def test_the_paired_gap_is_what_the_leaks_add_to_the_same_items():
    """Dirty items gain 0.3 with the leaks, clean ones 0.1: the difference of differences is 0.2,
    whatever the two models' dirty - clean gaps are on their own."""

    def sample(i, status, value):
        return {"item_id": f"q{i}", "contamination": status, "scores": {"acc": value}}

    statuses = ["dirty"] * 10 + ["clean"] * 30
    without = [sample(i, s, 0.5 if s == "dirty" else 0.4) for i, s in enumerate(statuses)]
    with_leaks = [sample(i, s, 0.8 if s == "dirty" else 0.5) for i, s in enumerate(statuses)]
    gap = contamination.paired_dirty_clean_gap(with_leaks, without, "acc")
    assert gap["dirty"].value == pytest.approx(0.3) and gap["clean"].value == pytest.approx(0.1)
    assert gap["gap"].value == pytest.approx(0.2) and gap["gap"].excludes(0)
    # items the other model did not score are left out; one split empty: nothing to say
    assert contamination.paired_dirty_clean_gap(with_leaks[:10], without, "acc") is None


def test_a_comparison_that_drops_one_sources_leaks_says_which(tmp_path):
    from hanlm.config import load_config
    from hanlm.stages.compare import comparison_config

    values = {"decontam.compare_drop": True, "decontam.action_sources": ["web"]}
    sub = comparison_config(load_config(values=values)).decontam  # the demo recipe: keep
    assert sub.action == "drop" and sub.action_sources == ["web"]
    kept = _samples("run/pretrain", 0, clean_acc=0.65, dirty_acc=0.95)
    dropped = _samples("drop/pretrain", 1, clean_acc=0.65, dirty_acc=0.65)
    text = contamination_section(_files(tmp_path, kept, dropped, ["web"]))
    assert "| web's leaks dropped (compare/drop) | demo_qa | accuracy |" in text


def test_the_report_pools_a_groups_tasks_under_its_outermost_name():
    """KMMLU's 45 subjects are one row of the report card's contamination table (their pooled
    items), not 45; item ids stay distinct; a task outside any group stays as it is."""
    from hanlm.report.contamination_section import pooled_by_group

    def samples(task: str, n: int) -> list[dict]:
        return [{"task": task, "item_id": str(i), "scores": {"acc": 1.0}} for i in range(n)]

    by_task = {("m", "kmmlu_a"): samples("kmmlu_a", 2), ("m", "kmmlu_b"): samples("kmmlu_b", 3)}
    by_task[("m", "demo_qa")] = samples("demo_qa", 4)
    groups = {"kmmlu_stem": ["kmmlu_a", "kmmlu_b"], "kmmlu": ["kmmlu_stem"]}
    pooled = pooled_by_group(by_task, groups)
    assert sorted(pooled) == [("m", "demo_qa"), ("m", "kmmlu")]
    ids = [s["item_id"] for s in pooled[("m", "kmmlu")]]
    assert ids == ["kmmlu_a/0", "kmmlu_a/1", "kmmlu_b/0", "kmmlu_b/1", "kmmlu_b/2"]
    assert [s["item_id"] for s in pooled[("m", "demo_qa")]] == ["0", "1", "2", "3"]
