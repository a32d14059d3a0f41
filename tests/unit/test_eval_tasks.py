"""Task logic without a model: GSM8K-ko answer extraction, IFEval-ko checkers (Korean particles,
eojeol counts, skipped types), macro F1, the direction prompts and contamination splits."""

import pytest

from hanlm.errors import UserError
from hanlm.evals import contamination
from hanlm.evals.tasks import TASKS, Task, get, macro_f1, names, parse_task_spec, register
from hanlm.evals.tasks.direction import forward_prompt, read_facts, reverse_prompt
from hanlm.evals.tasks.gsm8k_ko import extract_flexible, extract_strict, normalise, prompt
from hanlm.evals.tasks.ifeval_ko import check, check_loose, keyword_count, score_response


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("9 * 2 = 18이므로 18달러를 법니다.\n#### 18", "18", "18"),
        ("총 1,234원입니다. #### 1,234.", "1234", "1234"),
        ("답은 $18.", None, "18"),
        ("#### -3\n그래서 5개", "-3", "5"),
        ("모르겠습니다", None, None),
        ("가격은 ₩2,500 입니다", None, "2500"),
        ("#### 3.5", "3.5", "3.5"),
    ],
)
def test_gsm8k_extraction(text, strict, flexible):
    assert extract_strict(text) == strict
    assert extract_flexible(text) == flexible


def test_gsm8k_normalise_and_prompt():
    assert normalise("$1,000.") == "1000"
    shots = [{"question": "1+1은?", "answer": "1+1=2", "target": "2"}]
    text = prompt("2+2는?", shots)
    assert text == "질문: 1+1은?\n답변: 1+1=2\n#### 2\n\n질문: 2+2는?\n답변:"


def test_forbidden_word_counts_with_particles():
    kwargs = {"forbidden_words": ["사과"]}
    for response in ("사과를 먹었다.", "오늘 사과가 맛있다", "맛있는 사과.", '"사과"라고 했다'):
        assert check("keywords:forbidden_words", kwargs, response, "") is False, response
    # inside another word it is a different word
    assert check("keywords:forbidden_words", kwargs, "나는 풋사과 대신 배를 먹었다", "") is True
    assert keyword_count("학교에 갔다. 학교는 멀다. 학교", "학교") == 3


def test_word_count_is_by_eojeol():
    response = "나는 오늘 학교에 갔다"  # 4 eojeol, 9 syllables
    assert check(
        "length_constraints:number_words", {"relation": "less than", "num_words": 5}, response, ""
    )
    assert not check(
        "length_constraints:number_words", {"relation": "at least", "num_words": 5}, response, ""
    )


def test_english_case_types_are_skipped_and_counted():
    fields = {
        "prompt": "답하세요",
        "instruction_id_list": [
            "change_case:english_capital",
            "punctuation:no_comma",
            "unknown:type",
        ],
        "kwargs": [{}, {}, {}],
    }
    result = score_response(fields, "쉼표 없이 답합니다")
    assert result["strict"] == [True]
    assert result["skipped"] == ["change_case:english_capital", "unknown:type"]
    assert check("change_case:english_lowercase", {}, "abc", "") is None


def test_other_checkers_and_loose():
    assert check("detectable_format:title", {}, "<<봄의 노래>>\n내용", "")
    assert check("startend:end_checker", {"end_phrase": "감사합니다."}, "끝. 감사합니다.", "")
    assert check("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "")
    assert check("language:response_language", {"language": "ko"}, "한국어로 답합니다 OK", "")
    assert check("language:response_language", {"language": "ja"}, "こんにちは", "") is None
    assert check(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "그래서"},
        "첫 문단.\n\n그래서는 아니고 둘째 문단.",
        "",
    )
    response = "여기 답이 있습니다:\n*** 끝 ***"
    assert not check("startend:end_checker", {"end_phrase": "답이 있습니다:"}, response, "")
    assert check_loose("startend:end_checker", {"end_phrase": "답이 있습니다:"}, response, "")


def test_macro_f1_matches_the_definition():
    assert macro_f1([0, 1, 1, 0], [0, 1, 0, 0]) == pytest.approx((0.8 + 2 / 3) / 2)
    assert macro_f1([1, 1], [1, 1]) == 1.0


def test_direction_prompts_pick_the_particle():
    assert forward_prompt("프랑스", "capital") == "프랑스의 수도는"
    assert reverse_prompt("파리", "capital") == "파리를 수도로 하는 나라는"
    assert reverse_prompt("서울", "capital") == "서울을 수도로 하는 나라는"


def test_direction_facts_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_facts(tmp_path / "none.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text("subject\tobject\n가\t나\n", encoding="utf-8")
    with pytest.raises(UserError, match="relation"):
        read_facts(bad)


def test_direction_groups_facts_by_reverse_statements(tmp_path):
    table = tmp_path / "facts.tsv"
    table.write_text(
        "subject\trelation\tobject\treverse_stated\n"
        "프랑스\tcapital\t파리\tyes\n일본\tcapital\t도쿄\tno\n독일\tcapital\t베를린\tno\n",
        encoding="utf-8",
    )
    facts = read_facts(table)
    assert [f.reverse_stated for f in facts] == [True, False, False]
    samples = [
        {"reverse_stated": f.reverse_stated, "scores": {"gap": gap, "reverse_logprob": -gap}}
        for f, gap in zip(facts, (1.0, 4.0, 6.0), strict=True)
    ]
    scores = get("direction").aggregate(samples)
    assert scores["gap"]["value"] == pytest.approx(11 / 3) and scores["gap"]["n"] == 3
    assert scores["gap/reverse_stated"]["value"] == 1.0 and scores["gap/reverse_stated"]["n"] == 1
    assert scores["gap/reverse_unstated"]["value"] == 5.0
    assert scores["reverse_logprob/reverse_unstated"]["n"] == 2
    # without the column: no groups
    plain = tmp_path / "plain.tsv"
    plain.write_text("subject\trelation\tobject\n프랑스\tcapital\t파리\n", encoding="utf-8")
    assert read_facts(plain)[0].reverse_stated is None
    ungrouped = [{"reverse_stated": None, "scores": {"gap": 2.0}}]
    assert set(get("direction").aggregate(ungrouped)) == {"gap"}
    bad = tmp_path / "bad.tsv"
    bad.write_text(
        "subject\trelation\tobject\treverse_stated\n프랑스\tcapital\t파리\tmaybe\n",
        encoding="utf-8",
    )
    with pytest.raises(UserError, match="reverse_stated") as info:
        read_facts(bad)
    assert info.value.where.endswith("bad.tsv:2")


def test_contamination_splits(tmp_path):
    report = tmp_path / "items.jsonl"
    rows = [("a", "dirty"), ("b", "partial"), ("c", "clean"), ("d", "clean")]
    report.write_text(
        "".join(
            f'{{"benchmark": "kobest_boolq", "item_id": "{i}", "coverage": 0.5, "status": "{s}", "documents": []}}\n'
            for i, s in rows
        )
    )
    statuses = contamination.load_statuses(report)
    samples = [{"item_id": i} for i in "abcde"]
    splits, counts = contamination.split_samples(samples, "kobest_boolq", statuses)
    assert counts == {"full": 5, "clean": 2, "dirty": 2, "partial": 1, "unchecked": 1}
    assert [s["item_id"] for s in splits["dirty"]] == ["a", "b"]
    assert contamination.split_samples(samples, "kobest_boolq", None)[1] == {"full": 5}


def test_contamination_bad_reports(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        contamination.load_statuses(tmp_path / "missing.jsonl")
    bad = tmp_path / "items.jsonl"
    bad.write_text('{"benchmark": "x", "item_id": "1", "status": "maybe"}\n')
    with pytest.raises(UserError, match="maybe"):
        contamination.load_statuses(bad)
    bad.write_text("not json\n")
    with pytest.raises(UserError, match=r"items.jsonl:1"):
        contamination.load_statuses(bad)


def test_registry_accepts_new_tasks_and_rejects_unknown():
    assert {"kobest_boolq", "gsm8k_ko", "ifeval_ko", "direction", "demo_qa"} <= set(names())

    @register
    class Echo(Task):
        name = "echo_test"

    try:
        assert isinstance(get("echo_test"), Echo)
    finally:
        TASKS.pop("echo_test")
    with pytest.raises(UserError, match="unknown eval task"):
        get("kobest_nope")
    with pytest.raises(UserError, match="bad task"):
        parse_task_spec("kobest_boolq=")
    assert parse_task_spec("kobest_copa=/x/dev.tsv") == ("kobest_copa", "/x/dev.tsv")


def test_ifeval_ko_reads_the_hubs_snapshot_layout(tmp_path):
    """allganize/IFEval-Ko as `hf download` leaves it: parquet under data/, IFEval's fields, each
    instruction's kwargs a struct with every argument (None where unused): eval and decontam
    read it through hf:FOLDER:train, and the checkers ignore the unused arguments."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hanlm.evals.tasks.base import Options
    from hanlm.stages.decontam import benchmark_specs
    from hanlm.testsets import readers

    kwargs_type = pa.list_(
        pa.struct([("num_words", pa.int64()), ("relation", pa.string()),
                   ("num_paragraphs", pa.int64()), ("language", pa.string())])
    )  # fmt: skip
    rows = {
        "key": [1000, 1001],
        "prompt": ["서울에 대해 50단어 이상으로 써 주세요.", "한국어로만 세 문단을 써 주세요."],
        "instruction_id_list": [["length_constraints:number_words"],
                                ["language:response_language", "length_constraints:number_paragraphs"]],
        "kwargs": [
            [{"num_words": 50, "relation": "at least", "num_paragraphs": None, "language": None}],
            [{"num_words": None, "relation": None, "num_paragraphs": None, "language": "ko"},
             {"num_words": None, "relation": None, "num_paragraphs": 3, "language": None}],
        ],
    }  # fmt: skip
    folder = tmp_path / "IFEval-Ko"
    (folder / "data").mkdir(parents=True)
    table = pa.table({**{k: rows[k] for k in ("key", "prompt", "instruction_id_list")},
                      "kwargs": pa.array(rows["kwargs"], type=kwargs_type)})  # fmt: skip
    pq.write_table(table, folder / "data" / "train-00000-of-00001.parquet")
    spec = f"hf:{folder}:train"

    items = get("ifeval_ko").load(spec, demo_files=None, options=Options())
    assert [i.item_id for i in items] == ["1000", "1001"]
    three = "첫째 문단입니다.\n***\n둘째 문단입니다.\n***\n셋째 문단입니다."
    result = score_response(items[1].fields, three)
    assert result["strict"] == [True, True] and not result["skipped"]
    assert score_response(items[0].fields, "서울 " * 10)["strict"] == [False]
    [(task, path)] = benchmark_specs([f"ifeval_ko={spec}"], None)
    assert [i.overlap_text for i in readers.read(task, path)] == rows["prompt"]
