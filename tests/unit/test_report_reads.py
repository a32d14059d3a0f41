"""What the report card and the model card read, each file through its type.

`RunFiles` (the report card's) and publish's run files name every file; each one a card reads
has a type whose reader turns a missing, damaged or wrongly shaped file into a UserError, and a
new raw JSON read in report/ or share/ fails here until it is typed or listed with its reason.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from hanlm.data.corpus import CorpusStats
from hanlm.data.decontam.outputs import DecontamReport, read_items
from hanlm.demo.records import read_planted
from hanlm.errors import UserError
from hanlm.evals.results import EvalResults, read_samples
from hanlm.launch.cost import LaunchRecord
from hanlm.plan.estimate import Plan
from hanlm.plan.measured import RehearsalRecord
from hanlm.preflight.report import PreflightReport
from hanlm.report.run_files import RunFiles
from hanlm.results import Result
from hanlm.train.results import (
    ClosureCheck,
    PretrainSummary,
    SftDataReport,
    SftSummary,
    TokenAudit,
    read_metrics,
)

PACKAGE = Path(__file__).resolve().parents[2] / "hanlm"

# RunFiles field -> how the report card reads it
REPORT_READS = {
    "plan": Plan,
    "preflight": PreflightReport,
    "launch": LaunchRecord,
    "rehearsal": RehearsalRecord,
    "corpus_stats": CorpusStats,
    "decontam_report": DecontamReport,
    "pretrain_summary": PretrainSummary,
    "sft_summary": SftSummary,
    "closure": ClosureCheck,
    "ablation_closure": ClosureCheck,
    "audit": TokenAudit,
    "eval_results": EvalResults,
    "decontam_items": read_items,
    "eval_samples": read_samples,
    "compare_eval_samples": read_samples,
    "planted": read_planted,
    "pretrain_metrics": read_metrics,
    "sft_metrics": read_metrics,
}
NOT_JSON = {"name", "root", "plots", "config", "export_folder"}
# the model card's facts (hanlm.share.publish.read_facts), read through the same types; the
# export's config.json is transformers' file, not hanlm's (read as transformers writes it)
MODEL_CARD_TYPES = (EvalResults, DecontamReport, Plan, PreflightReport, PretrainSummary, SftSummary)
SFT_WRITES = (ClosureCheck, TokenAudit, SftDataReport)


def test_every_file_the_report_card_reads_is_listed_with_its_reader():
    fields = set(RunFiles.__dataclass_fields__)
    assert fields == set(REPORT_READS) | NOT_JSON


RAW_READS = ("read_json", "json.load", "json.loads")
# where a whole-document raw read is expected: GGUF's and publish's reads of transformers' own
# files (config.json, the tokenizer)
ALLOWED_RAW = {
    "share/gguf.py": 4,
    "share/publish.py": 1,
}


@pytest.mark.parametrize(
    "path",
    sorted([*(PACKAGE / "report").glob("*.py"), *(PACKAGE / "share").glob("*.py")]),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_cards_read_json_only_through_result_types(path: Path):
    calls = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in RAW_READS:
            calls += 1
    assert calls == ALLOWED_RAW.get(f"{path.parent.name}/{path.name}", 0), (
        "read a run's JSON through its Result type (hanlm.results), or list why not here"
    )


@pytest.mark.parametrize("kind", [*MODEL_CARD_TYPES, *SFT_WRITES, ClosureCheck])
def test_a_damaged_or_missing_result_is_a_clear_user_error(tmp_path: Path, kind: type[Result]):
    path = tmp_path / kind.FILE
    with pytest.raises(UserError, match="is missing"):
        kind.read(path)
    path.write_text("{not json")
    with pytest.raises(UserError, match="damaged"):
        kind.read(path)
    path.write_text(json.dumps({"unexpected": 1}))
    with pytest.raises(UserError, match="shape"):
        kind.read(path)


def test_a_damaged_metrics_line_is_a_clear_user_error(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []  # the training did not run
    good = {"step": 1, "loss": 2.0, "lr": 1e-3, "grad_norm": 0.5, "tokens": 10,
            "tokens_per_s": 100.0, "mfu": None, "peak_memory_gb": 0.1}  # fmt: skip
    path.write_text(json.dumps(good) + "\n" + json.dumps({"step": 2}) + "\n")
    with pytest.raises(UserError, match=r"line 2 of metrics\.jsonl is not a metrics record"):
        read_metrics(path)


def test_damaged_items_and_planted_files_are_clear_user_errors(tmp_path: Path):
    assert read_items(tmp_path / "items.jsonl") == [] and read_planted(tmp_path / "p.json") is None
    (tmp_path / "items.jsonl").write_text(json.dumps({"item_id": "x"}) + "\n")
    with pytest.raises(UserError, match=r"line 1 of items\.jsonl is not a decontam item"):
        read_items(tmp_path / "items.jsonl")
    (tmp_path / "p.json").write_text(json.dumps([{"item_id": "x"}]))
    with pytest.raises(UserError, match="not the demo world's planted items"):
        read_planted(tmp_path / "p.json")


def test_a_line_that_is_not_an_eval_sample_is_a_clear_user_error(tmp_path: Path):
    path = tmp_path / "samples.jsonl"
    assert read_samples(path) == []
    sample = {"model": "m", "task": "t", "item_id": "1", "prediction": 0, "scores": {"acc": 1.0},
              "reverse_stated": True}  # fmt: skip
    path.write_text(json.dumps(sample) + "\n" + json.dumps({"task": "t"}) + "\n")
    with pytest.raises(UserError, match=r"line 2 of samples\.jsonl is not an eval sample"):
        read_samples(path)
    path.write_text(json.dumps(sample) + "\n")
    assert read_samples(path) == [sample]  # a task's own fields kept
