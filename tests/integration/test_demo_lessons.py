"""The lessons a finished demo run must show, judged on its own files (HANLM_DEMO_RUN).

The demo model needs minutes to learn, so these run where a whole `hanlm run` of the demo recipe
has finished: `.ci/run` runs one after the test suite and points HANLM_DEMO_RUN at it. Unset,
they skip.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hanlm.evals import contamination

DEMO_RUN = os.environ.get("HANLM_DEMO_RUN")

pytestmark = pytest.mark.skipif(
    not DEMO_RUN,
    reason="the demo model needs minutes to learn: set HANLM_DEMO_RUN to a finished `hanlm run` "
    "of the demo recipe (decontam.compare_drop on) to check its lessons",
)


def _samples(run: str) -> Path:
    return Path(run) / "eval" / "samples.jsonl"


def contamination_split(samples: list[dict]) -> dict[str, list[float]]:
    assert samples, "no demo_qa scores of a base model"
    return contamination.scores_by_split(samples, "acc")


def _base_model_scores(samples_file: Path) -> dict[str, list[float]]:
    return contamination_split(_base_model_samples(samples_file))


def _base_model_results(run: Path) -> dict:
    results = json.loads((run / "eval" / "results.json").read_text())["results"]
    (base,) = [scores for model, scores in results.items() if model.endswith("/pretrain")]
    return base


def _base_model_samples(samples_file: Path) -> list[dict]:
    samples = [json.loads(line) for line in samples_file.read_text().splitlines() if line]
    return [s for s in samples if s["task"] == "demo_qa" and s["model"].endswith("/pretrain")]


def test_contaminated_items_score_higher_than_clean_ones():
    """Clean accuracy above chance, and dirty above clean, each judged by its 95% interval."""
    kept = contamination.dirty_clean_gap(**_base_model_scores(_samples(DEMO_RUN)))
    assert kept["clean"].low > 0.5, kept["clean"]
    assert kept["gap"].low > 0, kept["gap"]


def test_the_leaked_documents_add_what_the_same_items_lose_without_them():
    """Item by item, the model trained with the leaked documents minus the same recipe trained
    without them (compare/drop): on dirty items the accuracy and the log-likelihood margin of the
    right answer gain more than on clean ones (a difference of differences, free of which items
    happened to leak), and dirty-item accuracy is lower without the leaks."""
    run = Path(DEMO_RUN)
    kept = _base_model_samples(run / "eval" / "samples.jsonl")
    dropped = _base_model_samples(run / "compare" / "drop" / "eval" / "samples.jsonl")
    for metric in ("acc", "gold_margin"):
        paired = contamination.paired_dirty_clean_gap(kept, dropped, metric)
        assert paired is not None and paired["gap"].low > 0, (metric, paired)
    before = contamination.dirty_clean_gap(**contamination_split(kept))
    after = contamination.dirty_clean_gap(**contamination_split(dropped))
    assert after["dirty"].value < before["dirty"].value


def test_without_the_leaks_dirty_items_lose_their_lead():
    """The field's lesson: once the contaminated documents are gone, the lead vanishes. Trained
    without them, the dirty items score no higher than the clean ones (at the clean level, or
    below it where the leaked items happen to be harder ones)."""
    run = Path(DEMO_RUN)
    dropped = _base_model_samples(run / "compare" / "drop" / "eval" / "samples.jsonl")
    after = contamination.dirty_clean_gap(**contamination_split(dropped))
    assert after["gap"].low <= 0, after["gap"]


def test_reverse_statements_shrink_the_direction_gap():
    """The facts the text also states object first are known backwards better than the others,
    in the same base model."""
    direction = _base_model_results(Path(DEMO_RUN))["direction"]["full"]
    stated, unstated = direction["gap/reverse_stated"], direction["gap/reverse_unstated"]
    assert stated["n"] > 20 and unstated["n"] > 20
    assert stated["value"] < unstated["value"], (stated, unstated)
    reverse = direction["reverse_logprob/reverse_stated"]["value"]
    assert reverse > direction["reverse_logprob/reverse_unstated"]["value"]


def test_the_card_reports_this_runs_numbers():
    """The card's contamination line is the run's own clean accuracy, not a number from elsewhere."""
    run = Path(DEMO_RUN)
    clean = contamination.dirty_clean_gap(**_base_model_scores(_samples(DEMO_RUN)))
    card = (run / "report.md").read_text(encoding="utf-8")
    assert f"clean accuracy {clean['clean'].value:.3f} is above chance" in card


def _closure_checks(run: Path) -> dict[str, dict]:
    sft = run / "sft"
    by_variant = json.loads((sft / "summary.json").read_text())["closure_by_variant"]
    main = json.loads((sft / "closure.json").read_text())
    return {
        name: main
        if main["variant"] == name
        else json.loads((sft / "ablation" / name / "closure.json").read_text())
        for name in by_variant
    }


def _assert_frozen_rows_fail_and_trained_rows_end(run: Path, card: str) -> None:
    """LoRA with the chat rows frozen closes at most 10 of 50 answers (the worst frozen variant)
    and with them trained at least 45 of 50, or the card says why not with the numbers (the open
    answers loop); a frozen variant that closes more is explained on the card with its row's
    norm and rank."""
    checks = _closure_checks(run)
    frozen = {n: c for n, c in checks.items() if c["method"] == "lora" and not c["rows_trained"]}
    trained = {n: c for n, c in checks.items() if c["method"] == "lora" and c["rows_trained"]}
    assert {c["init"] for c in frozen.values()} == {"none", "mean"} and trained
    print({name: f"{c['closed']}/{c['total']}" for name, c in checks.items()})
    assert min(c["closed"] for c in frozen.values()) <= 10, checks
    best_name, best = max(trained.items(), key=lambda item: item[1]["closed"])
    if best["closed"] < 45:  # why not, on the card: the open answers loop (a 4.2M model's sums)
        left = best["total"] - best["closed"]
        assert best["closed"] + best["unclosed_looping"] >= 45, checks
        assert f"`{best_name}` left {left} answers open, {best['unclosed_looping']} of" in card
    assert "The field's failure, reproduced" in card
    for name, check in frozen.items():
        assert f"`{name}` ended {check['closed']} of {check['total']}" in card
        if check["closed"] > 10:  # why it could close: its row's norm against the trained rows'
            norm = check["diagnosis"]["before"]["row_norms"]["embedding"]["template"]["eot"]
            assert f"norm {norm:.2f} against the trained rows'" in card


def test_frozen_chat_rows_never_end_answers_for_two_seeds(tmp_path):
    """The field's closure lesson where it bites, LoRA with the embedding frozen, in the run
    itself and in its SFT comparison rerun with another seed (the held-out prompts and the data
    order change with it)."""
    from hanlm.pipeline import run_stage
    from hanlm.report.closure_section import closure_section
    from hanlm.stages.report import run_files
    from hanlm.stages.rundir import RunDir, load_run_config

    run = Path(DEMO_RUN)
    _assert_frozen_rows_fail_and_trained_rows_end(run, (run / "report.md").read_text())
    again = tmp_path / "run"
    shutil.copytree(
        run,
        again,
        ignore=lambda folder, names: (
            ["sft", "eval", "compare", "report.md", "plots"] if Path(folder) == run else []
        ),
    )
    seed = load_run_config(run).run.seed + 1
    run_stage("sft", load_run_config(again, values={"run.seed": seed}), again)
    files = run_files(RunDir(again))
    files.plots.mkdir(exist_ok=True)
    _assert_frozen_rows_fail_and_trained_rows_end(again, closure_section(files))
