"""Tasks of lm-evaluation-harness's registry in hanlm: names and groups expand as lm-eval expands
them, data comes from local copies in the published layout (tests/support/published_layouts.py) with
clear errors when it is missing, and their items are decontaminated like the built-in ones: a
KMMLU item leaked as its question and right answer (in any of the planting styles, or in lm-eval's
prompt form) is dirty, the others clean. Scores equal lm-eval's: tests/integration/test_harness.py.
"""

from __future__ import annotations

import json
import random

import pytest

import published_layouts
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.evals.tasks import Options, lm_eval_registry

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return published_layouts.write_all(tmp_path_factory.mktemp("lm-eval-data"))


def test_names_groups_and_comma_lists_expand_as_lm_eval_does():
    leaves, groups = tasks_lib.expand_specs(["kmmlu"])
    assert len(leaves) == 45 and "kmmlu_accounting" in leaves and "kmmlu_korean_history" in leaves
    by_name = {g.name: g for g in groups}
    assert set(by_name) == {"kmmlu", "kmmlu_stem", "kmmlu_humss", "kmmlu_applied_science",
                            "kmmlu_other"}  # fmt: skip
    assert groups[-1].name == "kmmlu"  # innermost first: its subgroups are scored before it
    assert sum(len(by_name[g].members) for g in by_name["kmmlu"].members) == 45
    # a group's tag expands to its tasks; CLIcK is two groups of tasks picked by id
    leaves, groups = tasks_lib.expand_specs(["click"])
    assert len(leaves) == 11 and [g.name for g in groups][-1] == "click"
    # --tasks a,b and repeated --task; a source follows each of a group's tasks; no duplicates
    leaves, groups = tasks_lib.expand_specs(["kobest_copa,haerae=D", "kobest_copa"])
    assert leaves[0] == "kobest_copa" and len(leaves) == 6
    assert all(leaf.endswith("=D") for leaf in leaves[1:]) and [g.name for g in groups] == [
        "haerae"
    ]
    # hanlm's own KoBEST tasks stay hanlm's (exact with lm-eval, and faster) inside lm-eval's group
    leaves, _ = tasks_lib.expand_specs(["kobest"])
    assert all(type(tasks_lib.get(leaf)).__module__.endswith("kobest") for leaf in leaves)
    assert isinstance(tasks_lib.get("kmmlu_accounting"), lm_eval_registry.LmEvalTask)


def test_bad_names_and_missing_data_are_user_errors(data, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="unknown eval task 'kmmlu_acounting'") as e:
        tasks_lib.expand_specs(["kmmlu_acounting"])
    assert "lm-eval ls tasks" in e.value.fix
    with pytest.raises(UserError, match="bad task"):
        tasks_lib.expand_specs(["kmmlu="])
    task = tasks_lib.get("kmmlu_accounting")
    with pytest.raises(UserError, match="no local copy of HAERAE-HUB/KMMLU") as e:
        task.load(str(tmp_path), demo_files=None, options=Options())
    assert "hf download HAERAE-HUB/KMMLU --repo-type dataset --local-dir" in e.value.fix
    # offline and no local copy: the error says what to download and how to give it
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(UserError, match="cannot load its data from the Hugging Face Hub") as e:
        task.load(None, demo_files=None, options=Options())
    assert "kmmlu_accounting=DIR" in e.value.fix and "hf download HAERAE-HUB/KMMLU" in e.value.fix
    # a local copy without the task's config
    (tmp_path / "HAERAE-HUB" / "KMMLU").mkdir(parents=True)
    with pytest.raises(UserError, match="cannot load its data from") as e:
        task.load(str(tmp_path), demo_files=None, options=Options())
    assert "the local copy lacks HAERAE-HUB/KMMLU (Accounting)" in e.value.fix


def test_items_have_their_natural_parts(data):
    """What a leak would contain: the question and the right answer's text, not its letter."""
    kmmlu = tasks_lib.get("kmmlu_accounting").load(str(data), demo_files=None, options=Options())
    rows = published_layouts.kmmlu_rows("Accounting", "test", 24)
    assert [i.item_id for i in kmmlu] == [str(k) for k in range(24)]
    for item, row in zip(kmmlu, rows, strict=True):
        assert item.parts == (row["question"], row["ABCD"[row["answer"] - 1]])
        assert item.forms[0].endswith(f"정답： {'ABCD'[row['answer'] - 1]}")
    haerae = tasks_lib.get("haerae_history").load(str(data), demo_files=None, options=Options())
    row = published_layouts.haerae_rows("history", 20)[0]
    question = row["query"].split("### 질문: \n")[1].split("\n")[0]
    answer = row["query"].split(row["answer"] + " ")[1].split("\n")[0]
    assert haerae[0].parts == (question, answer)  # the template lines and options left out
    click = tasks_lib.get("click_cul_economy").load(str(data), demo_files=None, options=Options())
    row = published_layouts.click_rows("Kedu_economy", 16)[0]
    assert click[0].parts == (row["paragraph"], row["question"], row["answer"])


def test_planted_kmmlu_items_are_dirty_and_the_others_clean(data, tmp_path, cli):
    """KMMLU items leaked as question plus right answer (re-spaced, embedded, ...) or in
    lm-eval's prompt form are found; none of the others is."""
    from test_decontam import STYLES, status_of

    items = tasks_lib.get("kmmlu_accounting").load(str(data), demo_files=None, options=Options())
    rng = random.Random(7)
    filler = [
        f"회사의 {k}번째 사업 보고서는 지난해보다 매출이 늘었다고 적었다." * 3 for k in range(40)
    ]
    docs, planted = [], {}
    for k, item in enumerate(items[:12]):
        style = list(STYLES)[k % len(STYLES)]
        text = STYLES[style](item.overlap_text, filler, rng)
        if k >= 8:  # as a prompt: the question, its options and "정답： B"
            text = f"{rng.choice(filler)}\n{item.forms[0]}\n{rng.choice(filler)}"
        docs.append({"id": f"plant-{k}", "text": text})
        planted[item.item_id] = "dirty"
    docs += [{"id": f"filler-{k}", "text": t} for k, t in enumerate(filler)]
    corpus = tmp_path / "train.jsonl"
    corpus.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    out = tmp_path / "out"
    result = cli("decontam", "--corpus", corpus, "--out", out, "--benchmark", f"kmmlu={data}")
    # the look-alike copy holds 2 of KMMLU's 45 subjects
    assert result.code == 2 and "the local copy lacks HAERAE-HUB/KMMLU (" in result.err
    bench = f"kmmlu_accounting={data}"
    result = cli("decontam", "--corpus", corpus, "--out", out, "--benchmark", bench)
    assert result.code == 0, result.out + result.err
    rows = status_of(out / "decontam" / "items.jsonl")
    assert len(rows) == len(items)
    for item_id, row in rows.items():
        assert row["status"] == planted.get(item_id, "clean"), row
        assert row["benchmark"] == "kmmlu_accounting"


# -- task files: your own task without code -------------------------------------------------------

EXAM = 'kind = "multiple_choice"\nitems = "exam.jsonl"\n'
ITEM = {
    "context": "사내 규정 시험: 다음 중 옳은 것은?",
    "choices": ["가 보기", "나 보기"],
    "gold": 1,
}


def write(folder, name: str, text: str, items: list | None = None):
    path = folder / name
    path.write_text(text)
    if items is not None:
        lines = [i if isinstance(i, str) else json.dumps(i, ensure_ascii=False) for i in items]
        (folder / "exam.jsonl").write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("text", "items", "needle"),
    [
        (EXAM + "itmes = 'x'\n", [ITEM], "setting itmes: Extra inputs"),
        ('items = "exam.jsonl"\n', [ITEM], "setting kind: Field required"),
        (EXAM.replace("multiple_choice", "choice"), [ITEM], "setting kind"),
        (EXAM + "num_fewshot = [\n", [ITEM], "not valid TOML"),
        (EXAM + "num_fewshot = 2\n", [ITEM], "no fewshot_items"),
        (EXAM + "answer_regex = '(a'\n", [ITEM], "answer_regex is for generation"),
        ('kind = "generation"\nitems = "exam.jsonl"\nanswer_regex = "(a"\n',
         [{"prompt": "p", "answer": "a"}], "not a regular expression"),
        (EXAM.replace("exam.jsonl", "missing.jsonl"), [ITEM], "missing.jsonl does not exist"),
        (EXAM, [ITEM, "{not json"], "exam.jsonl:2"),
        (EXAM, [ITEM, {**ITEM, "gold": 2}], "gold must be the right choice's index (0 to 1)"),
        (EXAM, [ITEM, {**ITEM, "gold": "다 보기"}], "exam.jsonl:2: gold"),
        (EXAM, [{**ITEM, "choices": "가"}], "choices must be a list"),
        (EXAM, [{"choices": ["a", "b"], "gold": 0}], "exam.jsonl:1: context"),
        ('kind = "generation"\nitems = "exam.jsonl"\n', [{"prompt": "p"}], "answer must be"),
    ],
)  # fmt: skip
def test_bad_task_files_and_items_name_file_line_and_field(tmp_path, text, items, needle):
    path = write(tmp_path, "exam.toml", text, items)
    with pytest.raises(UserError) as e:
        tasks_lib.get(str(path))
    assert needle in e.value.message, e.value.message


def test_bad_yaml_task_files_and_task_file_specs(tmp_path):
    path = write(tmp_path, "exam.yaml", "kind: multiple_choice\nitems: [unclosed\n", [ITEM])
    with pytest.raises(UserError, match="not valid YAML") as e:
        tasks_lib.get(str(path))
    assert f"{path}:" in e.value.message
    with pytest.raises(UserError, match="does not exist"):
        tasks_lib.get(str(tmp_path / "none.toml"))
    with pytest.raises(UserError, match="takes no =PATH"):
        tasks_lib.parse_task_spec(f"{path}=x.jsonl")


def test_a_task_files_items_are_decontaminated_by_their_natural_parts(tmp_path, cli):
    """A custom exam's item leaked as its question and right answer is dirty; the others clean."""
    exam = [
        {"context": f"사내 규정 {i}조에 따라 출장비를 정산하는 올바른 절차는 무엇인가?",
         "choices": [f"{i}일 안에 영수증을 첨부하여 부서장 승인을 받는다", f"{i}개월 뒤 구두로 보고한다"],
         "gold": i % 2}
        for i in range(10)
    ]  # fmt: skip
    path = write(tmp_path, "exam.toml", EXAM, exam)
    [item] = [i for i in tasks_lib.get(str(path)).load(None, demo_files=None, options=Options())][
        3:4
    ]
    assert item.benchmark == "exam" and item.parts == (exam[3]["context"], exam[3]["choices"][1])
    text = f"회의록입니다. {item.parts[0]} 답은 이렇다: {item.parts[1]}. 이상입니다."
    corpus = tmp_path / "train.jsonl"
    corpus.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    out = tmp_path / "out"
    result = cli("decontam", "--corpus", corpus, "--out", out, "--benchmark", path)
    assert result.code == 0, result.err
    from test_decontam import status_of

    rows = status_of(out / "decontam" / "items.jsonl")
    assert {k: r["status"] for k, r in rows.items() if r["status"] != "clean"} == {"3": "dirty"}
