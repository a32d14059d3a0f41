"""The lessons a finished demo run must show, judged on its own files (HANLM_DEMO_RUN).

The demo model needs minutes to learn, so these run where a whole `hanlm run` of the demo recipe
has finished: `.ci/run` runs one after the test suite and points HANLM_DEMO_RUN at it. Unset,
they skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hanlm.evals import contamination

DEMO_RUN = os.environ.get("HANLM_DEMO_RUN")

pytestmark = pytest.mark.skipif(
    not DEMO_RUN,
    reason="the demo model needs minutes to learn: set HANLM_DEMO_RUN to a finished `hanlm run` "
    "of the demo recipe (decontam.compare_drop on) to check its lessons",
)


def _base_model_scores(samples_file: Path) -> dict[str, list[float]]:
    samples = [json.loads(line) for line in samples_file.read_text().splitlines() if line]
    base = [s for s in samples if s["task"] == "demo_qa" and s["model"].endswith("/pretrain")]
    assert base, f"no demo_qa scores of a base model in {samples_file}"
    return contamination.scores_by_split(base, "acc")


def _base_model_results(run: Path) -> dict:
    results = json.loads((run / "eval" / "results.json").read_text())["results"]
    (base,) = [scores for model, scores in results.items() if model.endswith("/pretrain")]
    return base


def test_contaminated_items_inflate_the_score_and_dropping_them_undoes_it():
    """Clean accuracy above chance, dirty above clean, and without the leaked documents in
    training the dirty items back at the clean level: each judged by its 95% interval."""
    run = Path(DEMO_RUN)
    kept = contamination.dirty_clean_gap(**_base_model_scores(run / "eval" / "samples.jsonl"))
    dropped_file = run / "compare" / "drop" / "eval" / "samples.jsonl"
    dropped = contamination.dirty_clean_gap(**_base_model_scores(dropped_file))
    assert kept["clean"].low > 0.5, kept["clean"]
    assert kept["gap"].low > 0, kept["gap"]
    assert not dropped["gap"].excludes(0), dropped["gap"]
    assert dropped["dirty"].value < kept["dirty"].value


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
    clean = contamination.dirty_clean_gap(**_base_model_scores(run / "eval" / "samples.jsonl"))
    card = (run / "report.md").read_text(encoding="utf-8")
    assert f"clean accuracy {clean['clean'].value:.3f} is above chance" in card
