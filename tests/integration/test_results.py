"""Every stage result has one reader: a missing, damaged or wrongly shaped file is a UserError
that names the file, says what is wrong and how to make it again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hanlm import cli
from hanlm.data.corpus import CorpusStats
from hanlm.data.decontam.outputs import DecontamReport
from hanlm.data.shards import ShardsManifest
from hanlm.data.tokenizer import TokenizerStats
from hanlm.errors import UserError
from hanlm.evals.results import EvalResults
from hanlm.plan.estimate import Plan, make_plan
from hanlm.plan.inputs import FIELD_REPORT
from hanlm.preflight.report import PreflightReport
from hanlm.results import Result
from hanlm.train.results import ExportRecord, PretrainSummary, SftSummary

TYPES = (Plan, PreflightReport, CorpusStats, DecontamReport, TokenizerStats, ShardsManifest,
         PretrainSummary, ExportRecord, SftSummary, EvalResults)  # fmt: skip


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.__name__)
def test_a_missing_file_is_named(tmp_path: Path, kind: type[Result]):
    path = tmp_path / kind.FILE
    with pytest.raises(UserError) as caught:
        kind.read(path)
    assert str(path) in caught.value.message and "missing" in caught.value.message
    assert f"--from {kind.MADE_BY}" in caught.value.message
    assert kind.read_if_present(path) is None


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.__name__)
def test_a_damaged_file_is_named(tmp_path: Path, kind: type[Result]):
    path = tmp_path / kind.FILE
    path.write_text('{"cut off', encoding="utf-8")
    with pytest.raises(UserError) as caught:
        kind.read_if_present(path)
    assert str(path) in caught.value.message and "not JSON" in caught.value.message


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.__name__)
def test_a_file_of_another_shape_is_named(tmp_path: Path, kind: type[Result]):
    path = tmp_path / kind.FILE
    path.write_text(json.dumps({"something": "else"}), encoding="utf-8")
    with pytest.raises(UserError) as caught:
        kind.read(path)
    message = caught.value.message
    assert str(path) in message and "shape" in message and "something" in message
    assert not kind.is_one(path)


def test_a_plan_round_trips_with_the_same_json(tmp_path: Path):
    plan = make_plan(FIELD_REPORT)
    path = plan.write(tmp_path / Plan.FILE)
    again = Plan.read(path)
    assert again.to_json() == plan.to_json() == json.loads(path.read_text())
    assert again.memory is not None and again.memory.total == plan.memory.total
    assert Plan.is_one(path) and not CorpusStats.is_one(path)


def test_plan_out_recognises_a_plan_by_reading_it(tmp_path: Path, capsys):
    out = tmp_path / "plan.json"
    make_plan(FIELD_REPORT).write(out)
    assert cli.main(["plan", "--gpu", "rtx5090", "--out", str(out), "--force"]) == 0  # a plan
    assert Plan.is_one(out)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"setup": {}, "model": {}, "memory": {}, "time": {}}))
    # the keys of a plan alone do not make one: not replaced, even with --force
    assert cli.main(["plan", "--gpu", "rtx5090", "--out", str(other), "--force"]) == 2
    assert str(other) in capsys.readouterr().err


def test_what_reads_results_does_not_import_torch():
    """The result types live apart from the code that makes them, so the report card, the model
    card and publishing (and the planner) read a run without loading torch."""
    modules = ("hanlm.share.publish", "hanlm.report.card", "hanlm.share.model_card")
    code = (
        f"import sys, {', '.join(modules)}; print(sorted(m for m in sys.modules if m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for kind in TYPES:
        code = f"import sys, {kind.__module__}; print('torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "False", (kind.__module__, out.stderr[-2000:])


class Counted(Result):
    FILE = "counted.json"
    MADE_BY = "counted"

    n: int


@pytest.mark.parametrize("library_writes", [False, True], ids=["pipeline", "library"])
def test_a_stage_result_is_written_once(tmp_path: Path, monkeypatch, library_writes: bool):
    """The pipeline keeps a new_folder stage's result unless its build wrote it already (eval
    and export write their own: outside a run it is their folder's marker): never twice."""
    from hanlm import pipeline
    from hanlm import results as results_lib
    from hanlm.stages.markers import read_stage_marker
    from hanlm.stages.rundir import RunDir
    from hanlm.stages.stage import Stage, StageContext

    written = []
    real = results_lib.atomic_write_json
    monkeypatch.setattr(
        results_lib,
        "atomic_write_json",
        lambda path, data: (written.append(path), real(path, data)),
    )

    def build(ctx: StageContext) -> Counted:
        result = Counted(n=3)
        if library_writes:
            result.write(ctx.out / Counted.FILE)
        return result

    run = RunDir(tmp_path / "run")
    out = run.root / "counted"
    stage = Stage(name="counted", version=1, output=lambda run: out, result=Counted, build=build)
    ctx = StageContext(None, run, out, "fp", False)
    assert pipeline._build(stage, ctx, out) == Counted(n=3)
    assert [p.name for p in written] == [Counted.FILE]
    assert Counted.read(out / Counted.FILE) == Counted(n=3)
    assert read_stage_marker(out)["fingerprint"] == "fp"
