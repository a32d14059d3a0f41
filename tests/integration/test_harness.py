"""The harness scores like lm-evaluation-harness's HF backend: same per-item log-likelihoods (to
1e-4) and the same accuracies on KoBEST items, for a tiny hanlm model exported to a folder."""

import json
import logging
import shutil

import pytest

from conftest import KOBEST_FOLDERS, TINY_PRETRAIN, kobest_as_published
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.evals.harness import Model, cut_at_stop
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config
from kobest_reference import kobest_task_manager, lm_eval_task

# The sample each task is scored on: (split, row positions). The first dev and train rows, and
# train rows whose TSV text pandas' CSV quoting changes (a field opens with `"`; docs/kobest.md),
# so a reader that split tabs literally would feed the two harnesses different text.
QUOTED_TRAIN_ROWS = {"kobest_boolq": [44, 163, 3364], "kobest_hellaswag": [528, 590, 1807]}
SAMPLE = {
    name: [("dev", list(range(8))), ("train", list(range(4)) + QUOTED_TRAIN_ROWS.get(name, []))]
    for name in KOBEST_FOLDERS
}


@pytest.fixture(scope="module")
def model_dir(demo_run, tmp_path_factory):
    """The demo run trained for a few tiny steps and exported to a Hugging Face folder; 512
    positions, so that a long KoBEST train ending fits (lm-eval refuses a longer continuation)."""
    run_dir = tmp_path_factory.mktemp("harness") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    values = {**TINY_PRETRAIN, "pretrain.max_steps": 4, "pretrain.seq_len": 512}
    cfg = load_run_config(run_dir, values={**values, "pretrain.micro_batch": 1})
    run_stage("pretrain", cfg, run_dir)
    run_stage("export", cfg, run_dir)
    return run_dir / "pretrain" / "hf"


@pytest.fixture(scope="module")
def model(model_dir):
    return Model(model_dir, device="cpu", batch_size=8)


def _quoted_in_tsv(tsv, position: int) -> bool:
    """Whether a field of the row at `position` opens with a quote in the TSV text itself."""
    line = tsv.read_text(encoding="utf-8").splitlines()[position + 1]  # one line a row here
    return any(field.startswith('"') for field in line.split("\t"))


def test_kobest_matches_lm_evaluation_harness(model, model_dir, shared_data, tmp_path):
    """lm-eval reads skt/kobest_v1 as published (built from the TSV by the publisher's procedure),
    hanlm reads the TSV itself: every sampled item scores the same."""
    lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")
    pytest.importorskip("accelerate", reason="lm-evaluation-harness's HF backend needs accelerate")
    from datasets import concatenate_datasets
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    baseline = HFLM(pretrained=str(model_dir), device="cpu", batch_size=8, dtype="float32")
    manager = kobest_task_manager()
    lm_tasks, sampled, ours = {}, {}, {}
    for name, folder in KOBEST_FOLDERS.items():
        task = tasks_lib.get(name)
        items, published = [], []
        for split, positions in SAMPLE[name]:
            tsv = shared_data / "kobest" / folder / f"{split}.tsv"
            loaded = task.load(str(tsv), demo_files=None, options=tasks_lib.Options())
            items += [loaded[k] for k in positions]
            assert [loaded[k].item_id for k in positions] == [str(k) for k in positions]
            published.append(kobest_as_published(tsv, name).select(positions))
        for position in QUOTED_TRAIN_ROWS.get(name, []):
            assert _quoted_in_tsv(shared_data / "kobest" / folder / "train.tsv", position)
        sampled[name] = items
        ours[name] = task.evaluate(model, items, tasks_lib.Options())
        data_file = tmp_path / f"{name}.jsonl"
        concatenate_datasets(published).to_json(data_file, force_ascii=False)
        lm_tasks[name] = lm_eval_task(manager, name, data_file)
    out = lm_evaluate(lm=baseline, task_dict=lm_tasks, log_samples=True, verbosity="ERROR")
    for name in KOBEST_FOLDERS:
        task = tasks_lib.get(name)
        theirs = sorted(out["samples"][name], key=lambda s: s["doc_id"])
        size = sum(len(positions) for _, positions in SAMPLE[name])
        assert len(theirs) == len(ours[name]) == size
        for item, mine, ref in zip(sampled[name], ours[name], theirs, strict=True):
            where = (name, ref["doc_id"], mine["item_id"])
            # the very text scored: (context, delimiter + choice) for every choice
            choices = task.choices(item.fields)
            pairs = [(task.context(item.fields), task.target_delimiter + c) for c in choices]
            assert [tuple(a) for a in ref["arguments"]] == pairs, where
            target = ref["target"]  # the label, or (COPA) the right choice's text
            assert mine["gold"] == (target if isinstance(target, int) else choices.index(target))
            ref_lls = [float(r[0][0]) for r in ref["resps"]]
            assert mine["loglikelihoods"] == pytest.approx(ref_lls, abs=1e-4), where
            assert mine["scores"]["acc"] == ref["acc"], where
            if "acc_norm" in ref:
                assert mine["scores"]["acc_norm"] == ref["acc_norm"], where
        ours_acc = sum(s["scores"]["acc"] for s in ours[name]) / size
        assert ours_acc == pytest.approx(out["results"][name]["acc,none"])
        if name == "kobest_hellaswag":
            ours_norm = sum(s["scores"]["acc_norm"] for s in ours[name]) / size
            assert ours_norm == pytest.approx(out["results"][name]["acc_norm,none"])
        ours_f1 = task.aggregate(ours[name])["macro_f1"]["value"]
        assert ours_f1 == pytest.approx(out["results"][name]["f1,none"])
    del lm_eval


# lm-eval's own task definitions on look-alike local copies (tests/support/published_layouts.py): two
# KMMLU subjects, the HAE-RAE group (its five tasks and its size-weighted mean), two CLIcK tasks
LM_EVAL_SPECS = ["kmmlu_accounting", "kmmlu_korean_history", "haerae", "click_cul_economy"]


def test_lm_eval_registry_tasks_match_lm_evaluation_harness(model_dir, tmp_path):
    """KMMLU, HAE-RAE and CLIcK as lm-eval defines them: hanlm's harness and lm-eval's HF
    backend get the same prompts, log-likelihoods (1e-4), predictions, and group scores."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")
    pytest.importorskip("accelerate", reason="lm-evaluation-harness's HF backend needs accelerate")
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import published_layouts
    from hanlm.evals.run import run_evaluation

    data = published_layouts.write_all(tmp_path / "data")
    ours = run_evaluation(
        [model_dir], [f"{spec}={data}" for spec in LM_EVAL_SPECS], device="cpu", batch_size=8
    )
    # the reference: lm-eval's own loading of a task file of the user's (as `lm_eval
    # --include_path`), its tasks' dataset_path pointed at the same local copies
    local = {
        "kmmlu": data / "HAERAE-HUB/KMMLU",
        "haerae": data / "HAERAE-HUB/HAE_RAE_BENCH",
        "click": data / "EunsuKim/CLIcK",
    }

    def member(task: str) -> dict:
        # a datasets cache of its own: a local copy is otherwise cached by its README's file
        # list, so that an earlier test's copy could be read instead
        path, cache = str(local[task.split("_")[0]]), {"cache_dir": str(tmp_path / "cache")}
        return {"task": task, "dataset_path": path, "dataset_kwargs": cache}

    haerae_folder = published_layouts.REGISTRY_FOLDERS["haerae"]
    index = TaskManager(include_path=haerae_folder, include_defaults=False).task_index
    haerae = index["haerae"].cfg  # the group as lm-eval defines it
    groups = [
        {"group": "reference", "task": [member(t) for t in LM_EVAL_SPECS if t != "haerae"]},
        {**haerae, "group": "haerae_local", "task": [member(t) for t in haerae["task"]]},
    ]
    (tmp_path / "tasks").mkdir()
    for group in groups:  # JSON is YAML
        (tmp_path / "tasks" / f"{group['group']}.yaml").write_text(json.dumps(group))
    folders = [published_layouts.REGISTRY_FOLDERS[f] for f in ("kmmlu", "haerae", "click")]
    manager = TaskManager(include_path=[*folders, tmp_path / "tasks"], include_defaults=False)
    tasks = manager.load(["reference", "haerae_local"])
    baseline = HFLM(pretrained=str(model_dir), device="cpu", batch_size=8, dtype="float32")
    out = lm_evaluate(lm=baseline, task_dict=tasks, log_samples=True, bootstrap_iters=0)

    record = ours.record
    [model_name] = record.models
    assert set(record.tasks) == set(out["samples"])  # haerae: its five tasks
    assert len(record.tasks) == 8 and record.groups["haerae"] == sorted(record.groups["haerae"])
    for task, reference in out["samples"].items():
        mine = sorted(
            (s for s in ours.samples if s["task"] == task), key=lambda s: int(s["item_id"])
        )
        theirs = sorted(reference, key=lambda s: s["doc_id"])
        assert len(mine) == len(theirs) == record.tasks[task].items > 10
        for a, b in zip(mine, theirs, strict=True):
            where = (task, b["doc_id"])
            assert a["prompt"] == b["arguments"][0][0], where
            lls = [float(r[0][0]) for r in b["resps"]]
            assert a["loglikelihoods"] == pytest.approx(lls, abs=1e-4), where
            assert set(a["scores"]) == {m for m in ("acc", "acc_norm") if m in b}, where
            for metric in a["scores"]:
                assert a["scores"][metric] == b[metric], where
        for metric in mine[0]["scores"]:
            full = record.results[model_name][task]["full"][metric].value
            assert full == pytest.approx(out["results"][task][f"{metric},none"])
    group = record.results[model_name]["haerae"]["full"]
    assert group["acc"].n == sum(record.tasks[t].items for t in record.groups["haerae"])
    for metric in ("acc", "acc_norm"):
        reference = out["results"]["haerae_local"][f"{metric},none"]
        assert group[metric].value == pytest.approx(reference)


TASK_FILES = {
    "exam.toml": 'name = "my_exam"\nkind = "multiple_choice"\nitems = "exam.jsonl"\n'
    'fewshot_items = "exam-dev.jsonl"\nnum_fewshot = 2\nfewshot_seed = 7\n',
    "arith.yaml": "kind: generation\nitems: arith.jsonl\nnormalise: [strip, lowercase]\n"
    'answer_regex: "(-?[0-9]+)"\nuntil: ["\\n"]\nmax_new_tokens: 6\n',
}


def write_task_files(folder):
    """A multiple-choice exam (gold as an index or as the text, two shots from a dev file) and a
    generation task (answer by regex, stripped and lower-cased), with their items."""
    folder.mkdir()
    exam = []
    for i in range(12):
        choices = [f"{i}번 문항의 {k}번 보기: 규정 {k * 7 + i}조를 따른다" for k in range(4)]
        gold = (i * 3) % 4 if i % 2 else choices[(i * 3) % 4]
        exam.append({"context": f"사내 규정 시험 {i}번: 다음 중 옳은 것은?", "choices": choices,
                     "gold": gold})  # fmt: skip
    arith = [
        {"prompt": f"문제 {i}: {i} 더하기 {i}는?\n답:", "answer": str(2 * i)} for i in range(8)
    ]
    for name, rows in (("exam.jsonl", exam), ("exam-dev.jsonl", exam[:5]), ("arith.jsonl", arith)):
        (folder / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    for name, text in TASK_FILES.items():
        (folder / name).write_text(text)
    return folder


def test_task_files_score_as_their_lm_eval_yaml_does(model_dir, tmp_path):
    """A task file scores as the lm-eval YAML a user would write for it (written out here by
    hand): the same prompts with the same shots, log-likelihoods, generations and metrics."""
    pytest.importorskip("accelerate", reason="lm-evaluation-harness's HF backend needs accelerate")
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from hanlm.evals.run import run_evaluation

    folder = write_task_files(tmp_path / "mine")
    ours = run_evaluation(
        [model_dir], [str(folder / "exam.toml"), str(folder / "arith.yaml")], device="cpu"
    )
    cache = {"cache_dir": str(tmp_path / "cache")}
    reference = {
        "my_exam": {
            "task": "my_exam", "dataset_path": "json", "output_type": "multiple_choice",
            "dataset_kwargs": {"data_files": {"test": str(folder / "exam.jsonl"),
                                              "train": str(folder / "exam-dev.jsonl")}, **cache},
            "test_split": "test", "fewshot_split": "train", "num_fewshot": 2,
            "doc_to_text": "{{context}}", "doc_to_choice": "{{choices}}", "doc_to_target": "gold",
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        },
        "arith": {
            "task": "arith", "dataset_path": "json", "output_type": "generate_until",
            "dataset_kwargs": {"data_files": {"test": str(folder / "arith.jsonl")}, **cache},
            "test_split": "test", "doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
            "filter_list": [{"name": "answer", "filter": [
                {"function": "regex", "regex_pattern": "(-?[0-9]+)"}, {"function": "take_first"}]}],
            "metric_list": [{"metric": "exact_match", "aggregation": "mean",
                             "higher_is_better": True, "ignore_case": True,
                             "regexes_to_ignore": ["^\\s+|\\s+$"]}],
        },
    }  # fmt: skip
    (tmp_path / "ref").mkdir()
    for name, config in reference.items():  # JSON is YAML
        (tmp_path / "ref" / f"{name}.yaml").write_text(json.dumps(config))
    tasks = TaskManager(include_path=str(tmp_path / "ref"), include_defaults=False).load(
        ["my_exam", "arith"]
    )
    tasks["tasks"]["my_exam"].set_fewshot_seed(7)  # lm_eval --seed's fewshot seed
    baseline = HFLM(pretrained=str(model_dir), device="cpu", batch_size=8, dtype="float32")
    out = lm_evaluate(lm=baseline, task_dict=tasks, log_samples=True, bootstrap_iters=0)
    for task in ("my_exam", "arith"):
        mine = [s for s in ours.samples if s["task"] == task]
        theirs = sorted(out["samples"][task], key=lambda s: s["doc_id"])
        assert len(mine) == len(theirs) == ours.record.tasks[task].items
        for a, b in zip(mine, theirs, strict=True):
            assert a["prompt"] == b["arguments"][0][0], (task, b["doc_id"])
            if task == "my_exam":
                lls = [float(r[0][0]) for r in b["resps"]]
                assert a["loglikelihoods"] == pytest.approx(lls, abs=1e-4)
            else:  # the greedy text itself, then the answer the regex takes from it
                assert a["generations"] == b["resps"] and a["generations"][0][0], b["doc_id"]
                assert a["responses"] == b["filtered_resps"], b["doc_id"]
            assert a["scores"] == {m: b[m] for m in a["scores"]}
        for metric, score in ours.record.results[ours.record.models[0]][task]["full"].items():
            filtered = "answer" if task == "arith" else "none"
            assert score.value == pytest.approx(out["results"][task][f"{metric},{filtered}"])


def test_rolling_loglikelihood_matches_lm_evaluation_harness(model_dir, tmp_path):
    """Perplexity tasks (loglikelihood_rolling): texts longer than the model's 512 positions are
    cut into lm-eval's windows and score as under its HF backend."""
    pytest.importorskip("accelerate", reason="lm-evaluation-harness's HF backend needs accelerate")
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from hanlm.evals.lm_eval_model import HarnessLM

    sentence = "서울의 오래된 시장에서는 아침마다 상인들이 물건을 정리하며 하루를 시작한다. "
    texts = [sentence * k for k in (1, 7, 40)]  # the last: several windows of 512 tokens
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
    config = {
        "task": "rolling", "dataset_path": "json", "output_type": "loglikelihood_rolling",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(tmp_path / "c")},
        "test_split": "test", "doc_to_text": "", "doc_to_target": "{{text}}",
        "metric_list": [{"metric": m} for m in ("word_perplexity", "bits_per_byte")],
    }  # fmt: skip
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "rolling.yaml").write_text(json.dumps(config))
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    ours_lm = HarnessLM(Model(model_dir, device="cpu", batch_size=4))
    assert len(ours_lm.harness.encode(texts[-1])) > 2 * ours_lm.harness.max_length
    baseline = HFLM(pretrained=str(model_dir), device="cpu", batch_size=4, dtype="float32")
    outs = []
    for lm in (ours_lm, baseline):
        tasks = manager.load(["rolling"])
        outs.append(lm_evaluate(lm=lm, task_dict=tasks, log_samples=True, bootstrap_iters=0))
    ours, theirs = (sorted(o["samples"]["rolling"], key=lambda s: s["doc_id"]) for o in outs)
    for a, b in zip(ours, theirs, strict=True):
        assert float(a["resps"][0][0]) == pytest.approx(float(b["resps"][0][0]), abs=1e-3)
    for metric in ("word_perplexity,none", "bits_per_byte,none"):
        assert outs[0]["results"]["rolling"][metric] == pytest.approx(
            outs[1]["results"]["rolling"][metric], rel=1e-5
        )


def test_eval_cli_takes_lm_eval_spellings_and_writes_lm_eval_results(model_dir, tmp_path, cli):
    import published_layouts

    data = published_layouts.write_all(tmp_path / "data")
    out = tmp_path / "out"
    tasks = f"kmmlu_accounting={data},haerae={data}"
    result = cli("eval", "--model", model_dir, "--tasks", tasks, "--out", out, "--limit", "3",
                 "--num_fewshot", "1", "--batch_size", "4")  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads((out / "results.json").read_text())
    assert len(record["tasks"]) == 6 and record["groups"]["haerae"][0] == "haerae_general_knowledge"
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    kmmlu = [s for s in samples if s["task"] == "kmmlu_accounting"]
    assert len(kmmlu) == 3 and all(s["prompt"].count("정답：") == 2 for s in kmmlu)  # 1 shot
    [model] = record["models"]
    shaped = json.loads((out / "lm-eval" / model.replace("/", "__") / "results.json").read_text())
    assert shaped["group_subtasks"]["haerae"] == record["groups"]["haerae"]
    group = record["results"][model]["haerae"]["full"]["acc"]
    assert shaped["groups"]["haerae"]["acc,none"] == group["value"]
    assert isinstance(shaped["results"]["kmmlu_accounting"]["acc_stderr,none"], float)
    assert shaped["n-samples"]["kmmlu_accounting"] == {"original": 3, "effective": 3}


def test_eval_flags_keep_their_old_spellings():
    from hanlm.cli.parser import parse_args

    for spelling in (
        [
            "--task",
            "a",
            "--task",
            "b",
            "--num-fewshot",
            "2",
            "--batch-size",
            "3",
            "--chat-template",
        ],
        ["--tasks", "a,b", "--num_fewshot", "2", "--batch_size", "3", "--apply_chat_template"],
        ["--tasks", "a,b", "--num-fewshot", "2", "--batch-size", "3", "--apply-chat-template"],
    ):
        given = vars(parse_args(["eval", *spelling]))
        assert tasks_lib.split_specs(given["eval.tasks"]) == ["a", "b"], spelling
        keys = ("eval.num_fewshot", "eval.batch_size", "eval.chat_template")
        assert [given[k] for k in keys] == [2, 3, True], spelling


def test_encode_pair_moves_context_spaces(model):
    request = model.encode_pair("질문: 답변: ", "예")
    whole = model.encode("질문: 답변:" + " 예")
    assert request.context + request.continuation == whole
    assert request.context == model.encode("질문: 답변:")


def test_batching_does_not_change_scores(model_dir):
    pairs = [
        ("서울은 한국의", " 수도이다"),
        ("가나다라마바사 아자차카", " 타파하"),
        ("나는", " 학생이다"),
        ("나는", " 학생"),
    ]
    one = Model(model_dir, device="cpu", batch_size=1).loglikelihood(pairs)
    many = Model(model_dir, device="cpu", batch_size=4).loglikelihood(pairs)
    rows = Model(model_dir, device="cpu", batch_size=3, share_prefixes=False).loglikelihood(pairs)
    for (a, ga), (b, gb), (c, gc) in zip(one, many, rows, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and ga == gb
        assert a == pytest.approx(c, abs=1e-5) and ga == gc


def test_generate_stops_and_limits(model):
    outputs = model.generate(["서울은", "한국의 수도는 어디인가?"], stop=["\n"], max_new_tokens=5)
    assert len(outputs) == 2
    assert all("\n" not in o for o in outputs)
    assert cut_at_stop("답은 3\n\n질문:", ["질문:", "\n\n"]) == "답은 3"


def test_bad_model_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        Model(tmp_path / "missing")
    with pytest.raises(UserError, match="not a model folder"):
        Model(tmp_path)
    with pytest.raises(UserError, match="dtype"):
        Model(tmp_path, dtype="fp64")
