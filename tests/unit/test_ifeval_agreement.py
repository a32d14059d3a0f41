"""hanlm's IFEval-Ko checkers against lm-evaluation-harness's, on a sample of
benchmarks/ifeval_agreement.py's generated cases: agreement wherever hanlm documents none, and
each documented Korean difference behaving as documented (hanlm/evals/tasks/ifeval_ko.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hanlm.evals.tasks.ifeval_ko import check, check_loose, count_words

ROOT = Path(__file__).resolve().parents[2]


def _load_benchmark():
    path = ROOT / "benchmarks" / "ifeval_agreement.py"
    spec = importlib.util.spec_from_file_location("hanlm_bench_ifeval_agreement", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


agreement = _load_benchmark()


@pytest.fixture(scope="module")
def lm_eval_ifeval():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCAL_RANK", "1")  # lm-eval would try to download nltk's punkt_tab on rank 0
        pytest.importorskip("lm_eval.tasks.ifeval.utils", reason="lm-eval's IFEval not importable")
    return agreement.load_reference()


def _sample():
    return agreement.comparable(
        list(agreement.hand_written())
        + list(agreement.variations(6, seed=0))
        + list(agreement.soup(20, seed=0))
    )


def test_cases_agree_unless_a_documented_difference(lm_eval_ifeval):
    outcomes = agreement.compare(_sample(), lm_eval_ifeval)
    unexpected = [
        (o.case.instruction_id, o.case.kwargs, o.case.response, o.hanlm, o.lm_eval)
        for o in outcomes
        if o.unexpected
    ]
    assert unexpected == []
    english = [o for o in outcomes if o.case.lang == "en" and not o.case.known]
    assert len(english) > 400
    # the sample has passing and failing responses of every type
    for instruction_id in {o.case.instruction_id for o in outcomes}:
        verdicts = {
            o.lm_eval["strict"] for o in outcomes if o.case.instruction_id == instruction_id
        }
        assert verdicts == {True, False}, instruction_id


def test_every_documented_difference_is_real(lm_eval_ifeval):
    documented = [c for c in agreement.hand_written() if c.known]
    outcomes = agreement.compare(documented, lm_eval_ifeval)
    assert [o.case.response for o in outcomes if o.agrees("strict")] == []
    reasons = {
        agreement.KO_KEYWORD_INSIDE,
        agreement.KO_PARTICLE_FORBIDDEN,
        agreement.KO_EOJEOL_COUNT,
        agreement.KO_FIRST_WORD,
        agreement.KO_MIXED_LANGUAGE,
        agreement.TYPOGRAPHIC_QUOTES,
        agreement.FULLWIDTH_COMMA,
        agreement.LITERAL_TEXT,
    }
    assert {c.known for c in documented} == reasons


# (instruction, kwargs, response, hanlm's verdict, lm-eval's verdict), as the module documents
DOCUMENTED = [
    ("keywords:forbidden_words", {"forbidden_words": ["사과"]}, "사과를 먹었다.", False, True),
    ("keywords:forbidden_words", {"forbidden_words": ["AI"]}, "AI는 빠르다.", False, True),
    ("keywords:forbidden_words", {"forbidden_words": ["사과"]}, "풋사과를 먹었다.", True, True),
    ("keywords:existence", {"keywords": ["사과"]}, "풋사과만 먹었다.", False, True),
    (
        "length_constraints:number_words",
        {"num_words": 3, "relation": "less than"},
        "인공지능(AI)은 빠르게 발전한다.",  # 4 eojeol; lm-eval: 6 words
        False,
        False,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "인공지능(AI)은 빠르게 발전한다.",
        True,
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "그래서"},
        "첫 문단.\n\n그래서는 아니고 둘째.",
        True,
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "ai"},
        "첫 문단.\n\nAI는 빠르다.",
        True,
        False,
    ),
    (
        "language:response_language",
        {"language": "ko"},
        "Python으로 data pipeline을 만들었습니다.",
        True,
        False,
    ),
    ("startend:quotation", {}, "“봄은 짧습니다.”", True, False),
    ("punctuation:no_comma", {}, "사과，배.", False, True),
]


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "ours", "theirs"), DOCUMENTED)
def test_documented_differences(lm_eval_ifeval, instruction_id, kwargs, response, ours, theirs):
    case = agreement.Case(instruction_id, "ko", kwargs, response)
    assert agreement.ours(case, "strict") is ours
    assert agreement.reference(lm_eval_ifeval, case, "strict") is theirs


def test_not_compared_types_are_left_out():
    sentence_cases = [c for c in agreement.cases(2) if c.instruction_id == agreement.SENTENCE_ID]
    assert sentence_cases
    kept = agreement.comparable(sentence_cases)
    assert kept == ([] if not agreement.punkt_available() else sentence_cases)
    # what hanlm checks alone: a Hangul letter, and no language but Korean
    letter = {"letter": "가", "let_frequency": 2, "let_relation": "at least"}
    assert check("keywords:letter_frequency", letter, "가나다 가방", "") is True
    assert check("keywords:letter_frequency", letter, "가나다", "") is False
    assert check("language:response_language", {"language": "en"}, "Hello there.", "") is None


# IFEval's language-independent conventions that hanlm follows (checked without lm-eval)
CONVENTIONS = [
    ("keywords:forbidden_words", {"forbidden_words": ["apple"]}, "", False),
    ("punctuation:no_comma", {}, "  \n", False),
    ("keywords:existence", {"keywords": ["apple"]}, "pineapple", True),
    ("keywords:forbidden_words", {"forbidden_words": ["apple"]}, "apples", True),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at least"}, "I don't", True),
    ("length_constraints:number_words", {"num_words": 2, "relation": "less than"}, "a - ", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "a\n***\n***\nb", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***\na\n***\nb\n***", True),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "the"},
        "One.\n\nThe two.",
        True,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "the"},
        "One.\n\nTherefore two.",
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "the"},
        "One.\n \nThe two.",
        False,
    ),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\np. s. bye", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP. P. S bye", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "-a\n*b\n---\n**c**", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "**a**", True),
    ("detectable_format:json_format", {}, '```Json\n{"a": 1}\n```', True),
    ("detectable_format:title", {}, "<<>>>", False),
    ("combination:two_responses", {}, "******\na\n******\nb", True),
    ("combination:two_responses", {}, "a\n******\n\n******\nb", False),
    ("startend:end_checker", {"end_phrase": "Bye."}, '"Hi. Bye."', True),
    ("language:response_language", {"language": "ko"}, "1234", True),
]


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "expected"), CONVENTIONS)
def test_ifeval_conventions(instruction_id, kwargs, response, expected):
    assert check(instruction_id, kwargs, response, "") is expected


def test_loose_of_an_empty_response_fails_and_words_are_counted_per_eojeol():
    assert check_loose("punctuation:no_comma", {}, "", "") is False
    assert check_loose("change_case:english_capital", {}, "", "") is None
    assert count_words("AI(인공지능)는 state-of-the-art 모델 - 3.5%로") == 1 + 4 + 1 + 1
