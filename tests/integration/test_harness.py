"""The harness scores like lm-evaluation-harness's HF backend: same per-item log-likelihoods (to
1e-4) and the same accuracies on KoBEST items, for a tiny hanlm model exported to a folder."""

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
