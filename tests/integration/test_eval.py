"""The eval stage and `hanlm eval`: outputs, contamination splits, side-by-side models, skipping
a finished stage, and bad inputs as UserErrors."""

import json
import shutil

import pytest

from conftest import TINY_PRETRAIN, assert_user_error, write_jsonl
from damaged_models import damaged_copy
from hanlm.errors import UserError
from hanlm.evals import run as eval_run
from hanlm.evals.harness import Model
from hanlm.evals.results import EvalResults
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config
from user_files import snapshot, user_file, user_folder

EVAL = {
    "eval.tasks": ["demo_qa", "direction"],
    "eval.limit": 6,
    "eval.batch_size": 8,
    "eval.device": "cpu",
    "eval.distractors": 3,
}


@pytest.fixture(scope="module")
def trained(demo_run, tmp_path_factory):
    """The demo run trained for 2 tiny steps and exported to pretrain/hf."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    cfg = load_run_config(run_dir, values={**TINY_PRETRAIN, "pretrain.max_steps": 2})
    run_stage("pretrain", cfg, run_dir)
    run_stage("export", cfg, run_dir)
    return run_dir


@pytest.fixture
def run_dir(trained, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(trained, target, ignore=shutil.ignore_patterns("checkpoints"))
    return target


def _config(run_dir, **extra):
    return load_run_config(run_dir, values={**TINY_PRETRAIN, **EVAL, **extra})


def test_stage_writes_results_with_contamination_splits(run_dir):
    items = [json.loads(line) for line in (run_dir / "demo" / "benchmark.jsonl").open()][:6]
    statuses = ["dirty", "partial", "clean", "clean", "clean", "dirty"]
    write_jsonl(
        run_dir / "decontam" / "items.jsonl",
        [
            {
                "benchmark": "demo_qa",
                "item_id": it["item_id"],
                "coverage": 0.0,
                "status": s,
                "documents": [],
            }
            for it, s in zip(items, statuses, strict=True)
        ],
    )
    result = run_stage("eval", _config(run_dir), run_dir)
    out = run_dir / "eval"
    record = EvalResults.read(out / EvalResults.FILE)
    assert record == result
    model = record.models[0]
    qa = record.results[model]["demo_qa"]
    assert set(qa) == {"full", "clean", "dirty", "partial"}
    assert qa["full"]["acc"].n == 6 and qa["clean"]["acc"].n == 3
    assert qa["dirty"]["acc"].n == 3 and qa["partial"]["acc"].n == 1
    assert record.counts[model]["demo_qa"]["unchecked"] == 0
    direction = record.results[model]["direction"]
    assert set(direction) == {"full"}  # facts are not benchmark items
    full = direction["full"]
    assert full["gap"].value == pytest.approx(
        full["forward_logprob"].value - full["reverse_logprob"].value
    )
    samples = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert {s["task"] for s in samples} == {"demo_qa", "direction"}
    qa_sample = next(s for s in samples if s["task"] == "demo_qa")
    assert len(qa_sample["loglikelihoods"]) == 2 and qa_sample["contamination"] in statuses
    assert "| demo_qa | clean | acc |" in (out / "results.md").read_text()
    marker = (out / "stage.json").read_text()
    assert run_stage("eval", _config(run_dir), run_dir) == result  # up to date: skipped
    assert (out / "stage.json").read_text() == marker


def test_cli_side_by_side_models_and_kobest(run_dir, cli, shared_data, tmp_path):
    model = run_dir / "pretrain" / "hf"
    second = tmp_path / "copy" / "model-b"
    shutil.copytree(model, second)
    out = tmp_path / "out"
    result = cli(
        "eval", "--run", run_dir, "--model", model, "--model", second,
        "--task", f"kobest_copa={shared_data / 'kobest' / 'COPA' / 'dev.tsv'}",
        "--task", f"gsm8k_ko={shared_data / 'gsm8k-ko' / 'test_first300.jsonl'}",
        "--num-fewshot", "1", "--max-new-tokens", "4", "--limit", "3", "--out", out,
        "--device", "cpu",
    )  # fmt: skip
    assert result.code == 0, result.err
    record = EvalResults.read(out / EvalResults.FILE)
    assert len(record.models) == 2
    a, b = (record.results[m] for m in record.models)
    assert a["kobest_copa"]["full"]["acc"] == b["kobest_copa"]["full"]["acc"]
    assert set(a["gsm8k_ko"]["full"]) == {"exact_match_strict", "exact_match_flexible"}
    assert a["gsm8k_ko"]["full"]["exact_match_strict"].n == 3
    header = next(
        line for line in (out / "results.md").read_text().splitlines() if "| task" in line
    )
    assert header.count("|") == 6


def test_bad_inputs_are_user_errors(run_dir, cli, tmp_path):
    model = run_dir / "pretrain" / "hf"
    common = ("eval", "--run", run_dir, "--model", model, "--out", tmp_path / "o")
    assert_user_error(cli(*common, "--task", "kobest_boolq=/nowhere/dev.tsv"), "/nowhere/dev.tsv")
    assert_user_error(cli(*common, "--task", "no_such_task"), "unknown eval task")
    offline = cli(*common, "--task", "kobest_boolq")  # default hf:skt/kobest_v1 while offline
    assert_user_error(offline, "skt/kobest_v1", "download")
    bad = write_jsonl(tmp_path / "boolq.jsonl", [{"paragraph": "문단", "label": 1}])
    assert_user_error(cli(*common, "--task", f"kobest_boolq={bad}"), "question")
    assert_user_error(
        cli(*common, "--task", "demo_qa", "--contamination", tmp_path / "none.jsonl"), "none.jsonl"
    )
    assert_user_error(cli("eval", "--run", tmp_path / "empty", "--task", "demo_qa"), "export")
    assert not (tmp_path / "o").exists()
    with pytest.raises(UserError, match="no eval task"):
        eval_run.evaluate([model], [], tmp_path / "o")


@pytest.mark.parametrize(
    "damage", ["truncated weights", "garbled header", "pickle weights", "no tokenizer"]
)
def test_a_damaged_model_folder_is_refused_before_anything_runs(run_dir, cli, tmp_path, damage):
    folder, phrase = damaged_copy(run_dir / "pretrain" / "hf", tmp_path / "model", damage)
    out = tmp_path / "o"
    result = cli("eval", "--run", run_dir, "--model", folder, "--task", "demo_qa", "--out", out)
    assert_user_error(result, phrase)
    assert not out.exists()


def test_prompts_longer_than_the_context_lose_their_first_tokens_with_a_warning(trained, capsys):
    model = Model(trained / "pretrain" / "hf", device="cpu")
    long_text = "서울은 한국의 수도이다. " * 8000  # about 100k characters, 64 positions
    answers = model.generate([long_text, "서울은"], max_new_tokens=4)
    assert len(answers) == 2
    err = capsys.readouterr().err
    assert "1 of 2 prompts are longer than" in err and "first tokens were dropped" in err
    [(logprob, _)] = model.loglikelihood([(long_text, " 서울")])
    assert logprob < 0
    assert "1 of 1 scored texts are longer than" in capsys.readouterr().err


def test_out_that_is_a_file_or_a_users_folder_is_refused(run_dir, cli, tmp_path):
    model = run_dir / "pretrain" / "hf"
    common = ("eval", "--run", run_dir, "--model", model, "--task", "demo_qa", "--limit", "2")
    file = user_file(tmp_path / "results.json")
    folder = user_folder(tmp_path / "mine")
    before = snapshot(tmp_path)
    assert_user_error(cli(*common, "--out", file), "is a file, not a folder")
    for force in ([], ["--force"]):
        result = cli(*common, "--out", folder, *force)
        assert_user_error(result, "hanlm did not write (README.md, notes)")
    assert snapshot(tmp_path) == before


def test_out_holding_an_earlier_evaluation_is_replaced_only_with_force(run_dir, cli, tmp_path):
    model = run_dir / "pretrain" / "hf"
    out = tmp_path / "results"
    common = ("eval", "--run", run_dir, "--model", model, "--task", "demo_qa", "--out", out)
    assert cli(*common, "--limit", "2").code == 0
    assert EvalResults.read(out / EvalResults.FILE).models  # recognisable by it
    before = snapshot(out)
    assert_user_error(cli(*common, "--limit", "3"), "earlier hanlm output", "--force")
    assert snapshot(out) == before
    assert cli(*common, "--limit", "3", "--force").code == 0
    assert EvalResults.read(out / EvalResults.FILE).tasks["demo_qa"].items == 3
    (out / "notes.md").write_text("my notes on these results\n")
    before = snapshot(out)
    result = cli(*common, "--limit", "2", "--force")
    assert_user_error(result, "files hanlm did not write there (notes.md)")
    assert snapshot(out) == before
