"""`hanlm publish`: the folder it writes loads in transformers, its card parses with
huggingface_hub's own parser and holds every score of eval/results.json (full, clean and dirty)
beside the decontamination summary; the upload goes through HfApi only after the login is
checked; bad runs, a missing login and no network are UserErrors."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest

from conftest import TINY_PRETRAIN, assert_user_error
from hanlm.data.decontam.outputs import DecontamReport
from hanlm.evals.results import EvalResults, Score, TaskRecord, TaskScores
from hanlm.pipeline import run_stage
from hanlm.share import model_card
from hanlm.share import publish as publish_lib
from hanlm.stages.rundir import load_run_config, save_run_config
from hanlm.train.results import PretrainSummary

TINY = {
    **TINY_PRETRAIN,
    "pretrain.max_steps": 2,
    "sft.seq_len": 128,
    "sft.max_steps": 2,
    "sft.micro_batch": 4,
    "sft.batch_rows": 4,
    "sft.optimizer.warmup_steps": 1,
    "sft.heldout": 2,
    "sft.closure_max_tokens": 4,
    "eval.tasks": ["demo_qa", "direction"],
    "eval.limit": 8,
    "eval.batch_size": 8,
    "eval.device": "cpu",
    "eval.distractors": 3,
}
REPO = "me/ko-tiny"


@pytest.fixture(scope="module")
def finished_run(demo_run, tmp_path_factory):
    """The demo run taken through every stage in a few tiny steps: pretrain, export, SFT,
    eval, report card; its config.toml saved as `hanlm run` saves it. Tests copy it."""
    run_dir = tmp_path_factory.mktemp("publish") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain", "sft"))
    cfg = load_run_config(run_dir, values=TINY)
    for stage in ("pretrain", "export", "sft", "eval", "report"):
        run_stage(stage, cfg, run_dir)
    save_run_config(cfg, run_dir)
    return run_dir


@pytest.fixture
def run_dir(finished_run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(finished_run, target, ignore=shutil.ignore_patterns("checkpoints"))
    return target


def _results(run_dir) -> EvalResults:
    return EvalResults.read(run_dir / "eval" / EvalResults.FILE)


def _scores_of(run_dir, stage) -> dict[str, TaskScores]:
    results = _results(run_dir)
    (name,) = [m for m in results.models if m.endswith(f"/{stage}")]
    return results.results[name]


def _task(benchmark: str | None, source: str, items: int = 50) -> TaskRecord:
    return TaskRecord(benchmark=benchmark, source=source, items=items)


def _full_acc(value: float, stderr: float | None, n: int) -> TaskScores:
    return {"full": {"acc": Score(value=value, stderr=stderr, n=n)}}


def _card(folder):
    from huggingface_hub import ModelCard

    return ModelCard.load(folder / "README.md")


def _card_scores(card) -> dict:
    """{(task, split, metric): value} read back from the card's model-index."""
    found = {}
    for r in card.data.eval_results:
        key = (r.dataset_name, r.metric_config, r.metric_type)
        assert key not in found, key
        found[key] = r.metric_value
    return found


def _expected_scores(scores: dict[str, TaskScores]) -> dict:
    return {
        (task, split, metric): score.value
        for task, splits in scores.items()
        for split, metrics in splits.items()
        for metric, score in metrics.items()
        if score.value is not None and math.isfinite(score.value)
    }


def test_dry_run_card_holds_every_score_full_clean_dirty(run_dir, cli):
    result = cli("publish", run_dir, "--repo", REPO, "--dry-run")
    assert result.code == 0, result.err
    folder = run_dir / "publish"
    card = _card(folder)
    scores = _scores_of(run_dir, "sft")
    expected = _expected_scores(scores)
    assert _card_scores(card) == expected
    splits = {split for _, split, _ in expected}
    assert {"full", "clean", "dirty"} <= splits  # the fixture has contaminated items
    # n and stderr travel with each value
    for r in card.data.eval_results:
        score = scores[r.dataset_name][r.metric_config][r.metric_type]
        assert r.metric_args["n"] == score.n
        assert r.metric_args.get("stderr") == score.stderr
        assert f"n={score.n}" in r.metric_name
    # the decontamination summary sits beside the demo_qa scores
    decontam = DecontamReport.read(run_dir / "decontam" / DecontamReport.FILE)
    demo_qa = [r for r in card.data.eval_results if r.dataset_name == "demo_qa"]
    summary = decontam.benchmarks["demo_qa"]
    for r in demo_qa:
        assert r.dataset_args["decontam_items"] == summary.items
        assert r.dataset_args["decontam_dirty"] == summary.dirty
        assert r.dataset_args["decontam_found_whole"] == summary.found_whole
        assert r.dataset_args["decontam_found_only_by_parts"] == summary.found_only_by_parts
    assert f"| demo_qa | {summary.items} |" in card.text  # and in the body's table


def test_lm_eval_tasks_and_groups_go_into_the_card_with_their_splits(run_dir, cli):
    """A KMMLU subject and its group (lm-eval's registry) in the run's results: the card lists
    both, every split, and cites the subject's Hub data set (its task definition's)."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")
    results = _results(run_dir)
    (model,) = [m for m in results.models if m.endswith("/sft")]
    splits = {
        split: {"acc": Score(value=value, stderr=0.1, n=n)}
        for split, value, n in (("full", 0.4, 20), ("clean", 0.3, 15), ("dirty", 0.7, 5))
    }
    results.tasks["kmmlu_accounting"] = _task("kmmlu_accounting", None, items=20)
    results.groups["kmmlu"] = ["kmmlu_accounting"]
    for name in results.models:
        results.results[name]["kmmlu_accounting"] = splits
        results.results[name]["kmmlu"] = splits
        results.counts[name]["kmmlu_accounting"] = {"full": 20, "clean": 15, "dirty": 5}
    results.write(run_dir / "eval" / EvalResults.FILE)
    result = cli("publish", run_dir, "--repo", REPO, "--dry-run")
    assert result.code == 0, result.err
    card = _card(run_dir / "publish")
    found = _card_scores(card)
    for task in ("kmmlu_accounting", "kmmlu"):
        for split, metrics in splits.items():
            assert found[(task, split, "acc")] == metrics["acc"].value
    kmmlu = [r for r in card.data.eval_results if r.dataset_name == "kmmlu_accounting"]
    assert {(r.dataset_type, r.dataset_config) for r in kmmlu} == {
        ("HAERAE-HUB/KMMLU", "Accounting")
    }
    row = "| kmmlu | acc | 0.400 ± 0.100 (n=20) | 0.300 ± 0.100 (n=15) | 0.700 ± 0.100 (n=5) |"
    assert row in card.text, model


def test_card_metadata_round_trips_through_the_hub_parser(run_dir, cli):
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard import metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    assert cli("publish", run_dir, "--repo", REPO, "--dry-run").code == 0
    readme = run_dir / "publish" / "README.md"
    meta = metadata_load(readme)
    assert meta["language"] == ["ko"]
    assert meta["license"] == "apache-2.0"
    assert meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "text-generation"
    assert {"hanlm", "korean", "chat"} <= set(meta["tags"])
    assert "datasets" not in meta  # the demo world is no Hub dataset
    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == "ko-tiny"
    card = ModelCard(readme.read_text(encoding="utf-8"))
    assert [r.__dict__ for r in results] == [r.__dict__ for r in card.data.eval_results]
    # written again from the parsed data, the metadata is the same
    again = ModelCard(str(card))
    assert again.data.to_dict() == card.data.to_dict()


def test_the_recipes_hub_inputs_are_the_cards_datasets(run_dir, cli):
    config = run_dir / "config.toml"
    inputs = iter(
        [
            'inputs = ["hf:HuggingFaceFW/fineweb-2:kor_Hang:train", "/data/extra.jsonl"]',
            'inputs = ["hf:wikimedia/wikipedia:20231101.ko:train", "/data/extra.jsonl"]',
        ]
    )  # the recipe's two corpus sources
    text, count = re.subn(
        r"(?m)^inputs = \[[^\]]*\]", lambda _: next(inputs), config.read_text(encoding="utf-8")
    )
    assert count == 2
    config.write_text(text, encoding="utf-8")
    assert cli("publish", run_dir, "--repo", REPO, "--dry-run").code == 0
    card = _card(run_dir / "publish")
    assert card.data.datasets == ["HuggingFaceFW/fineweb-2", "wikimedia/wikipedia"]
    assert (
        "(https://huggingface.co/datasets/HuggingFaceFW/fineweb-2) (kor_Hang, train)" in card.text
    )
    assert "a local file (`extra.jsonl`)" in card.text


def test_folder_loads_in_transformers_and_the_cards_snippet_runs(run_dir, cli):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert cli("publish", run_dir, "--repo", REPO, "--dry-run").code == 0
    folder = run_dir / "publish"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template
    assert model.num_parameters() > 0
    # the published weights are the chat export's
    exported = (run_dir / "sft" / "hf" / "model.safetensors").read_bytes()
    assert (folder / "model.safetensors").read_bytes() == exported
    _run_snippet(folder, REPO)


def _run_snippet(folder, repo):
    """The card's transformers snippet, run on the folder in place of the repository."""
    snippet = re.search(r"```python\n(.*?)```", _card(folder).text, re.S).group(1)
    assert f'"{repo}"' in snippet
    snippet = snippet.replace(f'"{repo}"', repr(str(folder)))
    snippet = re.sub(r"max_new_tokens=\d+", "max_new_tokens=3", snippet)
    namespace: dict = {}
    exec(compile(snippet, "card-snippet", "exec"), namespace)
    assert namespace["output"].shape[1] > namespace["inputs"]["input_ids"].shape[1]


def test_card_has_recipe_hardware_report_and_its_plots(run_dir, cli):
    assert cli("publish", run_dir, "--repo", REPO, "--dry-run").code == 0
    folder = run_dir / "publish"
    text = _card(folder).text
    for heading in ("## How to use", "## Evaluation", "### Decontamination", "## Training",
                    "## Hardware and cost", "## Report card", "### 1. Plan"):  # fmt: skip
        assert heading in text, heading
    summary = PretrainSummary.read(run_dir / "pretrain" / PretrainSummary.FILE)
    assert f"| tokens seen | {summary.tokens:,} |" in text
    assert f"| sequence length | {TINY['pretrain.seq_len']} |" in text
    assert "| precision | fp32 |" in text
    assert "Not in this run" not in text
    linked = re.findall(r"\]\((plots/[^)]+\.png)\)", text)
    assert len(linked) >= 5
    for path in linked:
        assert (folder / path).read_bytes() == (run_dir / path).read_bytes()


def test_base_model_on_request(run_dir, cli):
    result = cli("publish", run_dir, "--repo", REPO, "--dry-run", "--model", "base")
    assert result.code == 0, result.err
    folder = run_dir / "publish"
    assert _card_scores(_card(folder)) == _expected_scores(_scores_of(run_dir, "pretrain"))
    exported = (run_dir / "pretrain" / "hf" / "model.safetensors").read_bytes()
    assert (folder / "model.safetensors").read_bytes() == exported
    assert "base-model" in _card(folder).data.tags
    _run_snippet(folder, REPO)


def test_a_run_without_decontam_report_or_plan_says_so(run_dir, cli):
    for name in ("decontam", "plots"):
        shutil.rmtree(run_dir / name)
    for name in ("plan/plan.json", "preflight/preflight.json", "report.md"):
        (run_dir / name).unlink()
    result = cli("publish", run_dir, "--repo", REPO, "--dry-run")
    assert result.code == 0, result.err
    card = _card(run_dir / "publish")
    assert _card_scores(card) == _expected_scores(_scores_of(run_dir, "sft"))
    for missing in ("a decontamination report", "a plan (plan.json)", "a preflight report",
                    "a report card"):  # fmt: skip
        assert f"Not in this run: {missing}" in card.text, missing
    assert not (run_dir / "publish" / "plots").exists()


def _fake_hub(monkeypatch, calls, user="me"):
    """HfApi at its boundary: the Hub's answers, recorded; nothing reaches the network."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoUrl

    def whoami(self, *args, **kwargs):
        calls.append(("whoami", self.token))
        return {"name": user}

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, **kwargs):
        from pathlib import Path

        folder = Path(kwargs["folder_path"])
        calls.append(("upload_folder", kwargs, sorted(p.name for p in folder.iterdir())))

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(HfApi, "whoami", whoami)
    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)


def test_upload_logs_in_then_uploads_the_written_folder(run_dir, cli, monkeypatch):
    calls: list = []
    _fake_hub(monkeypatch, calls)
    result = cli("publish", run_dir, "--repo", "ko-tiny", "--private")
    assert result.code == 0, result.err
    assert [c[0] for c in calls] == ["whoami", "create_repo", "upload_folder"]
    assert calls[0][1] == "hf_test_token"
    _, repo_id, options = calls[1]
    assert repo_id == "me/ko-tiny"  # the user's namespace, from the login
    assert options["private"] is True and options["exist_ok"] is True
    _, upload, files = calls[2]
    folder = run_dir / "publish"
    assert upload["repo_id"] == "me/ko-tiny"
    assert upload["folder_path"] == str(folder)
    assert upload["ignore_patterns"] == ["hanlm_publish.json"]  # hanlm's marker stays home
    assert {"README.md", "model.safetensors", "tokenizer.json", "plots"} <= set(files)
    assert '"me/ko-tiny"' in _card(folder).text
    assert "https://huggingface.co/me/ko-tiny" in result.out


def test_no_token_is_a_user_error_before_anything_is_written(run_dir, cli, monkeypatch, tmp_path):
    from huggingface_hub import HfApi, constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))

    def refuse(*args, **kwargs):
        raise AssertionError("the Hub was called without a login")

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    monkeypatch.setattr(HfApi, "upload_folder", refuse)
    assert_user_error(cli("publish", run_dir, "--repo", REPO), "hf auth login", "HF_TOKEN")
    assert not (run_dir / "publish").exists()


def test_no_network_is_a_user_error(run_dir, cli, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the real whoami, refused offline
    assert_user_error(cli("publish", run_dir, "--repo", REPO), "HF_HUB_OFFLINE", "--dry-run")
    assert not (run_dir / "publish").exists()

    from huggingface_hub import HfApi

    from hanlm.share.publish import network_errors

    transport = next(e for e in network_errors() if e is not OSError)

    def unreachable(self, *args, **kwargs):
        raise transport("Name or service not known")

    monkeypatch.setattr(HfApi, "whoami", unreachable)
    assert_user_error(cli("publish", run_dir, "--repo", REPO), "cannot reach", "hf auth login")


def test_bad_runs_say_which_stage_to_run(run_dir, cli, tmp_path):
    assert_user_error(cli("publish", tmp_path / "nowhere", "--dry-run"), "does not exist")
    shutil.rmtree(run_dir / "eval")
    assert_user_error(cli("publish", run_dir, "--dry-run"), "evaluation results", "hanlm eval")
    shutil.rmtree(run_dir / "sft")
    assert_user_error(
        cli("publish", run_dir, "--dry-run", "--model", "chat"), "no exported chat", "hanlm sft"
    )
    shutil.rmtree(run_dir / "pretrain" / "hf")
    assert_user_error(cli("publish", run_dir, "--dry-run"), "no exported base", "hanlm run")
    assert not (run_dir / "publish").exists()


def test_results_without_this_model_are_refused(run_dir, cli):
    path = run_dir / "eval" / "results.json"
    results = json.loads(path.read_text())
    (sft_name,) = [m for m in results["models"] if m.endswith("/sft")]
    del results["results"][sft_name], results["model_dirs"][sft_name]
    path.write_text(json.dumps(results))
    assert_user_error(cli("publish", run_dir, "--dry-run"), "no scores of", "hanlm eval")


def test_a_damaged_result_file_in_the_run_is_named(run_dir, cli):
    """A result file of the run cut short: exit 2 naming the file, what is wrong with it and
    the stage that makes it again; nothing published."""
    path = run_dir / "eval" / "results.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    result = cli("publish", run_dir, "--repo", REPO, "--dry-run")
    assert_user_error(result, str(path), "EvalResults file is damaged", "hanlm eval")
    assert not (run_dir / "publish").exists()


def test_bad_arguments_are_user_errors(run_dir, cli, tmp_path):
    assert_user_error(cli("publish", run_dir), "--repo")
    assert_user_error(cli("publish", run_dir, "--repo", "a/b/c", "--dry-run"), "not a Hub")
    assert_user_error(
        cli("publish", run_dir, "--dry-run", "--license", "Apache 2.0"), "publish.license"
    )
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    assert_user_error(cli("publish", run_dir, "--dry-run", "--gguf", not_gguf), "not a GGUF")
    assert_user_error(cli("publish", run_dir, "--dry-run", "--gguf", tmp_path / "x.gguf"))
    # a stage's own folder is never taken for an earlier publish folder, even with --force
    sft_files = sorted(p.name for p in (run_dir / "sft").iterdir())
    assert_user_error(
        cli("publish", run_dir, "--dry-run", "--out", run_dir / "sft", "--force"), "did not write"
    )
    assert sorted(p.name for p in (run_dir / "sft").iterdir()) == sft_files
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert_user_error(cli("publish", run_dir, "--dry-run", "--out", taken), "did not write")
    assert (taken / "notes.txt").read_text() == "mine"


def test_a_user_named_out_is_replaced_only_with_force(run_dir, cli, tmp_path):
    out = tmp_path / "out"
    assert cli("publish", run_dir, "--dry-run", "--out", out).code == 0
    assert_user_error(cli("publish", run_dir, "--dry-run", "--out", out), "--force")
    result = cli("publish", run_dir, "--dry-run", "--out", out, "--force", "--license", "mit")
    assert result.code == 0, result.err
    assert _card(out).data.license == "mit"
    # the run's own folder is rewritten without asking: it is derived from the run
    assert cli("publish", run_dir, "--dry-run").code == 0
    assert cli("publish", run_dir, "--dry-run").code == 0
    assert _card(run_dir / "publish").data.model_name == "run"  # the run's name


def test_gguf_goes_into_the_folder_and_the_card(run_dir, cli, tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "ko-tiny-f16.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = cli("publish", run_dir, "--repo", REPO, "--dry-run", "--gguf", path)
    assert result.code == 0, result.err
    folder = run_dir / "publish"
    assert (folder / path.name).read_bytes() == path.read_bytes()
    card = _card(folder)
    assert "gguf" in card.data.tags
    assert f"llama-cli -m {path.name}" in card.text


def test_hf_sources_become_datasets_and_dataset_ids():
    assert model_card.hf_dataset("hf:skt/kobest_v1:boolq:validation") == (
        "skt/kobest_v1",
        "boolq",
        "validation",
    )
    assert model_card.hf_dataset("hf:wikimedia/wikipedia") == ("wikimedia/wikipedia", None, None)
    assert model_card.hf_dataset("/data/boolq.tsv") is None
    facts = model_card.CardFacts(
        repo_id=REPO,
        kind="chat",
        license="apache-2.0",
        model_config={},
        parameters=None,
        scores={
            "kobest_boolq": _full_acc(0.6, 0.01, 100),
            "kobest_copa": _full_acc(0.7, None, 50),
            "kobest_copa_again": _full_acc(0.8, None, 50),
        },
        tasks={
            "kobest_boolq": _task("kobest_boolq", "hf:skt/kobest_v1:boolq:test", 100),
            "kobest_copa": _task("kobest_copa", "hf:skt/kobest_v1:copa:test"),
            "kobest_copa_again": _task(None, "hf:skt/kobest_v1:copa:test"),
        },
        datasets=["HuggingFaceFW/fineweb-2"],
    )
    results = model_card.eval_results(facts)
    assert [(r.dataset_type, r.dataset_config, r.dataset_split) for r in results] == [
        ("skt/kobest_v1", "boolq", "test"),
        ("skt/kobest_v1", "copa", "test"),
        ("kobest_copa_again", None, None),  # a second task on one dataset keeps its own result
    ]
    assert model_card.card_data(facts).datasets == ["HuggingFaceFW/fineweb-2"]


def test_a_local_copy_of_a_hub_benchmark_names_the_hub_dataset():
    tasks = {
        "kobest_wic": _task("kobest_wic", "/data/WiC/SKT_WiC_Test.tsv", 4),
        "demo_qa": _task("demo_qa", "/run/demo/benchmark.jsonl", 4),
        "someone_elses": _task(None, "/data/x.jsonl", 4),
    }
    sources = publish_lib.hub_sources(tasks)
    assert sources == {"kobest_wic": ("skt/kobest_v1", "wic", None)}  # no split claimed for a file
    facts = model_card.CardFacts(
        repo_id=REPO,
        kind="base",
        license="mit",
        model_config={},
        parameters=None,
        scores={name: _full_acc(0.5, None, 4) for name in tasks},
        tasks=tasks,
        hub_sources=sources,
    )
    results = model_card.eval_results(facts)
    assert [(r.dataset_type, r.dataset_config, r.dataset_split) for r in results] == [
        ("skt/kobest_v1", "wic", None),
        ("demo_qa", None, None),
        ("someone_elses", None, None),
    ]
