"""IFEval checkers: hanlm's Korean-aware ones against lm-evaluation-harness's, case by case.

A deterministic generator writes Korean and English responses for every instruction type the two
share (hand-written edge cases plus seeded variations around each threshold), with the kwargs each
type needs, some following the instruction and some not. Both checkers score every case, strict
and loose: hanlm's `hanlm.evals.tasks.ifeval_ko.check` / `check_loose` and lm-eval's own scoring
functions (`lm_eval.tasks.ifeval.utils.test_instruction_following_strict` / `_loose`).

A case that exercises one of hanlm's documented Korean differences carries that reason (`known`);
any disagreement on a case without one is a bug and is printed as UNEXPECTED.

Not compared: `length_constraints:number_sentences` unless nltk's `punkt_tab` data is installed
(lm-eval splits sentences with it; it is not on PyPI and is not downloaded here), `change_case:*`
and `detectable_format:constrained_response` (hanlm skips them), and response languages other
than Korean (hanlm has no language detector and skips them).

    python benchmarks/ifeval_agreement.py [--variations 30] [--seed 0] [--show 3]
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # benchmarks/tokenize.py would shadow the standard library's `tokenize`.
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]

import argparse
import json
import logging
import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hanlm.evals.tasks.ifeval_ko import check, check_loose

# Reasons for the differences hanlm keeps on purpose (hanlm/evals/tasks/ifeval_ko.py's docstring).
KO_KEYWORD_INSIDE = "ko: keyword inside another eojeol (hanlm: not that word)"
KO_PARTICLE_FORBIDDEN = "ko: particle after a forbidden word (lm-eval's \\b misses it)"
KO_EOJEOL_COUNT = "ko: eojeol with punctuation inside is one word"
KO_FIRST_WORD = "ko: first word with a particle, or after “"
KO_MIXED_LANGUAGE = "ko: Korean with English terms is Korean (langdetect: not)"
TYPOGRAPHIC_QUOTES = "typographic quotes “…” accepted"
FULLWIDTH_COMMA = "full-width comma ， rejected"
LITERAL_TEXT = "keyword is literal text (lm-eval: a regex)"

SENTENCE_ID = "length_constraints:number_sentences"


@dataclass(frozen=True)
class Case:
    instruction_id: str
    lang: str  # "ko" or "en" (the en side also holds the few language-neutral responses)
    kwargs: dict
    response: str
    prompt: str = "Answer the question."
    known: str | None = None  # the documented reason when hanlm may differ on this case
    label: str = ""  # what the case tests, for the report


# ---------------------------------------------------------------------------------------------
# Material
# ---------------------------------------------------------------------------------------------

KO = [
    "오늘은 날씨가 맑고 따뜻합니다.",
    "서울의 봄은 짧지만 아름답습니다.",
    "우리는 공원에서 천천히 산책했습니다.",
    "학교는 집에서 그리 멀지 않습니다.",
    "저녁에는 도서관에서 책을 읽었습니다!",
    "내일도 비가 올까요?",
    "기차는 정시에 부산에 도착했습니다.",
    "할머니께서 맛있는 김치찌개를 끓여 주셨습니다.",
    "새로운 프로젝트는 다음 주에 시작됩니다.",
    "회의는 오후 세 시에 끝났습니다.",
]
# Eojeol with punctuation inside: one word for hanlm, two or three `\w+` runs for lm-eval.
KO_PUNCTUATED = [
    "인공지능(AI)은 빠르게 발전하고 있습니다.",
    "올해 성장률은 3.5%로 예상됩니다.",
    "그는 '최고'라고 말했습니다.",
]
EN = [
    "The weather is clear and warm today.",
    "Spring in Seoul is short but beautiful.",
    "We walked slowly through the park.",
    "The school is not far from our home.",
    "In the evening I read at the library!",
    "Will it rain again tomorrow?",
    "The train arrived in Busan on time.",
    "Grandma made a delicious kimchi stew.",
    "The new project starts next week.",
    "It's a state-of-the-art model, isn't it?",
    "Growth is expected to reach 3.5% this year.",
    "The meeting ended at three o'clock.",
]
POOL = {"ko": KO, "en": EN}
WORDS = {
    "ko": ["사과", "학교", "기차", "도서관", "프로젝트"],
    "en": ["apple", "school", "train", "library", "project"],
}
# Forms of a keyword in running text: (text, whether it is a Korean-special form).
# Korean: a particle after the word is the same word; inside another eojeol it is not.
KO_FORMS = [("{w}", False), ("{w}를", False), ("{w}가", False), ("{w}.", False), ("풋{w}", True)]
EN_FORMS = [("{w}", False), ("{W}", False), ("{w}s", False), ("pine{w}", False), ("{w}.", False)]
PLACEHOLDERS = {"ko": ["[이름]", "[주소]", "[날짜]", "[회사명]"], "en": ["[name]", "[address]"]}
END_PHRASES = {"ko": "더 궁금한 점이 있으신가요?", "en": "Is there anything else I can help with?"}
SPLITTERS = {"ko": ["섹션", "SECTION"], "en": ["Section", "SECTION"]}
PROMPTS = {
    "ko": "서울의 봄에 대해 짧게 설명해 주세요.",
    "en": "Write a short note about spring in Seoul.",
}


def text(rng: random.Random, lang: str, k: int | None = None, avoid: str = "") -> str:
    """k sentences of the language's pool (1 to 3 when not given), none containing `avoid`."""
    k = k if k is not None else rng.randint(1, 3)
    pool = [s for s in POOL[lang] if not avoid or avoid.lower() not in s.lower()]
    return " ".join(rng.sample(pool, k))


def threshold(rng: random.Random, n: int) -> tuple[str, int]:
    """A relation and a threshold near the true count n (both sides of it)."""
    k = max(1, n + rng.choice((-1, 0, 1)))
    return rng.choice(("less than", "at least")), k


# ---------------------------------------------------------------------------------------------
# Hand-written cases: the edges of each checker, both languages
# ---------------------------------------------------------------------------------------------


def hand_written() -> Iterator[Case]:
    c = Case
    ex, fq, fb = "keywords:existence", "keywords:frequency", "keywords:forbidden_words"
    yield c(ex, "en", {"keywords": ["apple", "train"]}, "An apple fell on the train.")
    yield c(ex, "en", {"keywords": ["apple", "train"]}, "An APPLE fell on the bus.")
    yield c(ex, "en", {"keywords": ["apple"]}, "I like pineapples.", label="inside a word")
    yield c(ex, "en", {"keywords": ["apple"]}, "Apples are red.")
    yield c(ex, "ko", {"keywords": ["사과"]}, "사과를 먹었습니다.")
    yield c(ex, "ko", {"keywords": ["사과", "기차"]}, "사과를 들고 기차에 탔습니다.")
    yield c(ex, "ko", {"keywords": ["사과", "기차"]}, "사과를 들고 버스에 탔습니다.")
    yield c(ex, "ko", {"keywords": ["사과"]}, "나는 풋사과만 먹었다.", known=KO_KEYWORD_INSIDE)
    yield c(ex, "ko", {"keywords": ["AI"]}, "AI는 빠르게 발전합니다.")
    yield c(ex, "en", {"keywords": ["a.m."]}, "My alma mater.", known=LITERAL_TEXT)
    yield c(ex, "ko", {"keywords": ["(주)"]}, "주식회사 한빛입니다.", known=LITERAL_TEXT)
    yield c(ex, "ko", {"keywords": ["(주)"]}, "(주)한빛입니다.")
    yield c(
        fq,
        "en",
        {"keyword": "apple", "frequency": 2, "relation": "at least"},
        "apple pie and an Apple.",
    )
    yield c(
        fq,
        "en",
        {"keyword": "apple", "frequency": 2, "relation": "less than"},
        "apple pie and pineapple.",
    )
    yield c(fq, "en", {"keyword": " apple ", "frequency": 1, "relation": "at least"}, "An apple.")
    yield c(
        fq,
        "ko",
        {"keyword": "학교", "frequency": 3, "relation": "at least"},
        "학교에 갔다. 학교는 멀다. 학교",
    )
    yield c(
        fq,
        "ko",
        {"keyword": "사과", "frequency": 2, "relation": "less than"},
        "사과와 풋사과를 샀다.",
        known=KO_KEYWORD_INSIDE,
    )
    yield c(fb, "en", {"forbidden_words": ["apple"]}, "I ate an apple.")
    yield c(fb, "en", {"forbidden_words": ["apple"]}, "I ate two apples.", label="other word")
    yield c(fb, "en", {"forbidden_words": ["apple", "pear"]}, "Pineapple and PEAR.")
    yield c(fb, "en", {"forbidden_words": ["apple"]}, "APPLE!")
    yield c(fb, "ko", {"forbidden_words": ["사과"]}, "사과 한 개를 먹었다.")
    yield c(fb, "ko", {"forbidden_words": ["사과"]}, "맛있는 사과.")
    yield c(fb, "ko", {"forbidden_words": ["사과"]}, "나는 풋사과 대신 배를 먹었다.")
    yield c(fb, "ko", {"forbidden_words": ["사과"]}, "사과를 먹었다.", known=KO_PARTICLE_FORBIDDEN)
    yield c(fb, "ko", {"forbidden_words": ["사과"]}, '"사과"라고 했다.')
    yield c(
        fb,
        "ko",
        {"forbidden_words": ["AI"]},
        "AI는 빠르게 발전합니다.",
        known=KO_PARTICLE_FORBIDDEN,
    )
    yield c(fb, "ko", {"forbidden_words": ["AI"]}, "AI 기술은 빠르게 발전합니다.")

    lf = "keywords:letter_frequency"
    yield c(
        lf, "en", {"letter": "e", "let_frequency": 3, "let_relation": "at least"}, "The tree here."
    )
    yield c(lf, "en", {"letter": "E", "let_frequency": 3, "let_relation": "less than"}, "EEE")
    yield c(
        lf,
        "en",
        {"letter": "Z", "let_frequency": 1, "let_relation": "less than"},
        "No such letter.",
    )
    yield c(
        lf,
        "ko",
        {"letter": "a", "let_frequency": 2, "let_relation": "at least"},
        "AI와 data를 다룹니다.",
    )
    yield c(
        lf,
        "ko",
        {"letter": "a", "let_frequency": 2, "let_relation": "less than"},
        "한국어만 씁니다.",
    )

    rl = "language:response_language"
    yield c(rl, "ko", {"language": "ko"}, "오늘은 날씨가 맑습니다.")
    yield c(rl, "ko", {"language": "ko"}, "인공지능(AI)은 빠르게 발전하고 있습니다.")
    yield c(rl, "en", {"language": "ko"}, "The weather is clear today.")
    yield c(rl, "en", {"language": "ko"}, "1234 5678", label="no letters: followed")
    yield c(rl, "en", {"language": "ko"}, "The weather is clear. 날씨가 맑습니다.")
    yield c(
        rl,
        "ko",
        {"language": "ko"},
        "Python으로 data pipeline을 만들었습니다.",
        known=KO_MIXED_LANGUAGE,
    )
    yield c(
        rl,
        "ko",
        {"language": "ko"},
        "GPU 메모리를 줄이려면 gradient checkpointing을 쓰세요.",
        known=KO_MIXED_LANGUAGE,
    )

    nw = "length_constraints:number_words"
    yield c(
        nw, "en", {"num_words": 4, "relation": "less than"}, "I don't know.", label="don't is 2"
    )
    yield c(nw, "en", {"num_words": 6, "relation": "at least"}, "A state-of-the-art model.")
    yield c(
        nw,
        "en",
        {"num_words": 3, "relation": "less than"},
        "Yes - no - maybe",
        label="- is no word",
    )
    yield c(nw, "en", {"num_words": 2, "relation": "at least"}, "3.5 percent")
    yield c(nw, "ko", {"num_words": 5, "relation": "less than"}, "나는 오늘 학교에 갔다")
    yield c(nw, "ko", {"num_words": 4, "relation": "at least"}, "나는 오늘 학교에 갔다")
    yield c(nw, "ko", {"num_words": 4, "relation": "less than"}, "- 사과 - 배 - 감")
    yield c(
        nw,
        "ko",
        {"num_words": 4, "relation": "at least"},
        "인공지능(AI)은 빠르게 발전한다.",
        known=KO_EOJEOL_COUNT,
    )
    yield c(
        nw,
        "ko",
        {"num_words": 4, "relation": "less than"},
        "성장률은 3.5%로 예상된다.",
        known=KO_EOJEOL_COUNT,
    )

    np_ = "length_constraints:number_paragraphs"
    yield c(np_, "en", {"num_paragraphs": 2}, "One.\n***\nTwo.")
    yield c(
        np_, "en", {"num_paragraphs": 2}, "***\nOne.\n***\nTwo.\n***", label="dividers at the ends"
    )
    yield c(np_, "en", {"num_paragraphs": 2}, "One.\n***\n***\nTwo.", label="empty paragraph")
    yield c(np_, "en", {"num_paragraphs": 3}, "One.***Two.***Three.")
    yield c(np_, "en", {"num_paragraphs": 1}, "Just one paragraph.")
    yield c(np_, "ko", {"num_paragraphs": 2}, "첫째 문단입니다.\n***\n둘째 문단입니다.")
    yield c(np_, "ko", {"num_paragraphs": 3}, "첫째 문단입니다.\n***\n둘째 문단입니다.")
    yield c(
        np_, "ko", {"num_paragraphs": 2}, "첫째.\n\n***\n\n\n***\n둘째.", label="empty paragraph"
    )

    nf = "length_constraints:nth_paragraph_first_word"
    two = {"num_paragraphs": 2, "nth_paragraph": 2}
    yield c(nf, "en", {**two, "first_word": "the"}, "First.\n\nThe second.", label="case")
    yield c(nf, "en", {**two, "first_word": "the"}, "First.\n\nTherefore second.", label="prefix")
    yield c(nf, "en", {**two, "first_word": "the"}, 'First.\n\n"The," he said.')
    yield c(nf, "en", {**two, "first_word": "the"}, "First.\n \nThe second.", label="not \\n\\n")
    yield c(nf, "en", {**two, "first_word": "the"}, "First.\n\n\nThe second.")
    yield c(nf, "en", {**two, "first_word": "the"}, "First.\n\n\n\nThe second.", label="empty part")
    yield c(nf, "en", {**two, "first_word": "first"}, "First.\n\nThe second.\n\nThird.")
    yield c(
        nf,
        "en",
        {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "first"},
        "First.\n\nThe second.\n\nThird.",
    )
    yield c(nf, "ko", {**two, "first_word": "그래서"}, "첫 문단.\n\n그래서 둘째 문단.")
    yield c(nf, "ko", {**two, "first_word": "그래서"}, "첫 문단.\n\n그래서, 둘째 문단.")
    yield c(nf, "ko", {**two, "first_word": "그래서"}, "첫 문단.\n\n그러나 둘째 문단.")
    yield c(
        nf,
        "ko",
        {**two, "first_word": "그래서"},
        "첫 문단.\n\n그래서는 아니고 둘째.",
        known=KO_FIRST_WORD,
    )
    yield c(
        nf,
        "ko",
        {**two, "first_word": "봄"},
        "첫 문단.\n\n“봄은 짧다”고 했다.",
        known=KO_FIRST_WORD,
    )
    yield c(nf, "ko", {**two, "first_word": "AI"}, "첫 문단.\n\nAI는 빠르다.", known=KO_FIRST_WORD)
    yield c(nf, "ko", {**two, "first_word": "AI"}, "첫 문단.\n\nAI, 빠르다.")

    ph = "detectable_content:number_placeholders"
    yield c(ph, "en", {"num_placeholders": 2}, "Dear [name], see you at [address].")
    yield c(ph, "en", {"num_placeholders": 2}, "Dear [name], see you soon.")
    yield c(ph, "ko", {"num_placeholders": 1}, "[이름]님, 안녕하세요.")
    yield c(ph, "ko", {"num_placeholders": 3}, "[이름]님, [날짜]에 뵙겠습니다.")

    ps = "detectable_content:postscript"
    yield c(ps, "en", {"postscript_marker": "P.S."}, "Hello.\n\nP.S. See you.")
    yield c(ps, "en", {"postscript_marker": "P.S."}, "Hello.\n\np. s. see you.", label="spaced")
    yield c(ps, "en", {"postscript_marker": "P.S."}, "Hello.\n\nPS see you.")
    yield c(ps, "en", {"postscript_marker": "P.P.S"}, "Hello.\n\nP. P. S. see you.")
    yield c(ps, "en", {"postscript_marker": "P.P.S"}, "Hello.\n\nP.S. see you.")
    yield c(ps, "en", {"postscript_marker": "Note:"}, "Hello.\nnote: see you.")
    yield c(ps, "ko", {"postscript_marker": "P.S."}, "안녕하세요.\n\nP.S. 다음에 봐요.")
    yield c(ps, "ko", {"postscript_marker": "추신"}, "안녕하세요.\n\n추신: 다음에 봐요.")
    yield c(ps, "ko", {"postscript_marker": "추신"}, "안녕하세요. 다음에 봐요.")

    bl = "detectable_format:number_bullet_lists"
    yield c(bl, "en", {"num_bullets": 2}, "* one\n* two")
    yield c(bl, "en", {"num_bullets": 2}, "- one\n-two\n1. three")
    yield c(bl, "en", {"num_bullets": 2}, "*one\n  * two\n**bold** line")
    yield c(bl, "en", {"num_bullets": 3}, "* one\n---\n* two", label="--- is a bullet")
    yield c(bl, "en", {"num_bullets": 1}, "Intro:\n\n* only one\n")
    yield c(bl, "ko", {"num_bullets": 3}, "* 사과\n* 배\n* 감")
    yield c(bl, "ko", {"num_bullets": 3}, "• 사과\n• 배\n• 감")
    yield c(bl, "ko", {"num_bullets": 2}, "과일:\n- 사과\n- 배\n\n**참고** 제철 과일")

    hl = "detectable_format:number_highlighted_sections"
    yield c(hl, "en", {"num_highlights": 2}, "*one* and *two*")
    yield c(hl, "en", {"num_highlights": 2}, "**one** and * *")
    yield c(hl, "en", {"num_highlights": 1}, "***both***")
    yield c(hl, "en", {"num_highlights": 2}, "*a**b*")
    yield c(hl, "en", {"num_highlights": 1}, "*across\nlines*")
    yield c(hl, "ko", {"num_highlights": 2}, "*첫째* 그리고 **둘째**")
    yield c(hl, "ko", {"num_highlights": 3}, "*첫째* 그리고 **둘째**")

    ms = "detectable_format:multiple_sections"
    yield c(
        ms, "en", {"section_spliter": "Section", "num_sections": 2}, "Section 1\nA.\nSection 2\nB."
    )
    yield c(
        ms, "en", {"section_spliter": "SECTION", "num_sections": 2}, "Section 1\nA.\nSection 2\nB."
    )
    yield c(
        ms, "en", {"section_spliter": " Section ", "num_sections": 2}, "Section1 A. Section2 B."
    )
    yield c(ms, "ko", {"section_spliter": "섹션", "num_sections": 2}, "섹션 1\n가.\n섹션 2\n나.")
    yield c(ms, "ko", {"section_spliter": "섹션", "num_sections": 3}, "섹션 1\n가.\n섹션 2\n나.")

    js = "detectable_format:json_format"
    yield c(js, "en", {}, '{"a": 1}')
    yield c(js, "en", {}, '```Json\n{"a": 1}\n```')
    yield c(js, "en", {}, "```\n[1, 2]\n```")
    yield c(js, "en", {}, '{"a": 1} and more')
    yield c(js, "ko", {}, '```json\n{"이름": "홍길동"}\n```')
    yield c(js, "ko", {}, "이름: 홍길동")

    tt = "detectable_format:title"
    yield c(tt, "en", {}, "<<Spring>>\nText.")
    yield c(tt, "en", {}, "<< >>\nText.")
    yield c(tt, "en", {}, "<<>>>")
    yield c(tt, "en", {}, "<<Spring\nTime>>")
    yield c(tt, "ko", {}, "<<봄의 노래>>\n내용")
    yield c(tt, "ko", {}, "《봄의 노래》\n내용")

    tr = "combination:two_responses"
    yield c(tr, "en", {}, "Yes.\n******\nNo.")
    yield c(tr, "en", {}, "Yes.\n******\nYes.")
    yield c(tr, "en", {}, "******\nYes.\n******\nNo.", label="leading separator")
    yield c(tr, "en", {}, "Yes.\n******\n\n******\nNo.", label="empty middle")
    yield c(tr, "en", {}, "Yes.\n******\nNo.\n******\nMaybe.")
    yield c(tr, "ko", {}, "네.\n******\n아니요.")
    yield c(tr, "ko", {}, "네.\n*****\n아니요.")

    rp = "combination:repeat_prompt"
    en_p, ko_p = PROMPTS["en"], PROMPTS["ko"]
    yield c(rp, "en", {"prompt_to_repeat": en_p}, f"  {en_p.upper()}\nSpring is short.")
    yield c(rp, "en", {"prompt_to_repeat": en_p}, "Spring is short.")
    yield c(rp, "ko", {"prompt_to_repeat": ko_p}, f"{ko_p}\n서울의 봄은 짧습니다.")
    yield c(rp, "ko", {"prompt_to_repeat": ko_p}, "서울의 봄은 짧습니다.")

    ec = "startend:end_checker"
    en_e, ko_e = END_PHRASES["en"], END_PHRASES["ko"]
    yield c(ec, "en", {"end_phrase": en_e}, f"Done. {en_e}  \n")
    yield c(ec, "en", {"end_phrase": en_e}, f'"Done. {en_e}"', label='closing "')
    yield c(ec, "en", {"end_phrase": en_e}, f"Done. {en_e} Bye.")
    yield c(ec, "en", {"end_phrase": en_e.upper()}, f"Done. {en_e}")
    yield c(ec, "ko", {"end_phrase": ko_e}, f"끝났습니다. {ko_e}")
    yield c(ec, "ko", {"end_phrase": ko_e}, f"{ko_e} 끝났습니다.")

    qu = "startend:quotation"
    yield c(qu, "en", {}, '"Spring is short."')
    yield c(qu, "en", {}, '  "Spring is short."\n')
    yield c(qu, "en", {}, '"Spring is short.')
    yield c(qu, "en", {}, '"')
    yield c(qu, "en", {}, "“Spring is short.”", known=TYPOGRAPHIC_QUOTES)
    yield c(qu, "ko", {}, '"봄은 짧습니다."')
    yield c(qu, "ko", {}, "봄은 짧습니다.")
    yield c(qu, "ko", {}, "“봄은 짧습니다.”", known=TYPOGRAPHIC_QUOTES)

    nc = "punctuation:no_comma"
    yield c(nc, "en", {}, "No commas here.")
    yield c(nc, "en", {}, "Yes, a comma.")
    yield c(nc, "ko", {}, "쉼표 없이 답합니다.")
    yield c(nc, "ko", {}, "사과, 배, 감.")
    yield c(nc, "ko", {}, "사과，배.", known=FULLWIDTH_COMMA)

    # An empty or blank response follows no instruction, whatever the instruction.
    for instruction_id, kwargs in (
        (fb, {"forbidden_words": ["apple"]}),
        (nc, {}),
        (nw, {"num_words": 5, "relation": "less than"}),
        (lf, {"letter": "a", "let_frequency": 1, "let_relation": "less than"}),
        (fq, {"keyword": "apple", "frequency": 1, "relation": "less than"}),
        (rl, {"language": "ko"}),
    ):
        yield c(instruction_id, "en", kwargs, "", label="empty")
        yield c(instruction_id, "ko", kwargs, "  \n ", label="blank")


# ---------------------------------------------------------------------------------------------
# Seeded variations: each template builds one case for one language
# ---------------------------------------------------------------------------------------------

Template = Callable[[random.Random, str], Case]
TEMPLATES: dict[str, Template] = {}


def template(instruction_id: str) -> Callable[[Template], Template]:
    def register(fn: Template) -> Template:
        TEMPLATES[instruction_id] = fn
        return fn

    return register


def _with_forms(rng: random.Random, lang: str, word: str, n: int) -> tuple[str, bool]:
    """Running text with n forms of `word` mixed in; whether a Korean-special form is used."""
    forms = KO_FORMS if lang == "ko" else EN_FORMS
    chunks, special = [text(rng, lang, 1, avoid=word)], False
    for _ in range(n):
        form, is_special = rng.choice(forms)
        special |= is_special
        chunks.append(form.format(w=word, W=word.upper()))
        chunks.append(text(rng, lang, 1, avoid=word))
    return " ".join(chunks), special


@template("keywords:existence")
def _existence(rng: random.Random, lang: str) -> Case:
    words = rng.sample(WORDS[lang], rng.randint(1, 2))
    body, special = _with_forms(rng, lang, words[0], rng.randint(0, 2))
    if len(words) > 1:
        body = body.replace(words[1], "") + (" " + words[1] if rng.random() < 0.6 else "")
    known = KO_KEYWORD_INSIDE if special else None
    return Case("keywords:existence", lang, {"keywords": words}, body, known=known)


@template("keywords:frequency")
def _frequency(rng: random.Random, lang: str) -> Case:
    word, n = rng.choice(WORDS[lang]), rng.randint(0, 4)
    body, special = _with_forms(rng, lang, word, n)
    relation, k = threshold(rng, n)
    kwargs = {"keyword": word, "frequency": k, "relation": relation}
    return Case(
        "keywords:frequency", lang, kwargs, body, known=KO_KEYWORD_INSIDE if special else None
    )


@template("keywords:forbidden_words")
def _forbidden(rng: random.Random, lang: str) -> Case:
    word = rng.choice(WORDS[lang])
    if lang == "ko":
        # bare (both find it), inside another eojeol (neither), with a particle (only hanlm)
        forms = [("{w} 하나", None), ("풋{w}", None), ("{w}를", KO_PARTICLE_FORBIDDEN), ("", None)]
    else:
        forms = [("{w}", None), ("{W}.", None), ("{w}s", None), ("pine{w}", None), ("", None)]
    form, known = rng.choice(forms)
    filler = [text(rng, lang, 1, avoid=word) for _ in range(2)]
    body = " ".join([filler[0], form.format(w=word, W=word.upper()), filler[1]])
    return Case("keywords:forbidden_words", lang, {"forbidden_words": [word]}, body, known=known)


@template("keywords:letter_frequency")
def _letter(rng: random.Random, lang: str) -> Case:
    body = text(rng, lang)
    if lang == "ko":
        body += " " + rng.choice(["AI와 data를 씁니다.", "OK라고 답했습니다.", "Seoul은 크다."])
    letter = rng.choice("aeiost")
    relation, k = threshold(rng, body.lower().count(letter))
    kwargs = {"letter": rng.choice([letter, letter.upper()]), "let_frequency": k}
    return Case("keywords:letter_frequency", lang, {**kwargs, "let_relation": relation}, body)


@template("language:response_language")
def _language(rng: random.Random, lang: str) -> Case:
    return Case("language:response_language", lang, {"language": "ko"}, text(rng, lang, 2))


@template("length_constraints:number_words")
def _words(rng: random.Random, lang: str) -> Case:
    body = text(rng, lang)
    known = None
    if lang == "ko" and rng.random() < 0.3:
        body += " " + rng.choice(KO_PUNCTUATED)
        known = KO_EOJEOL_COUNT
    if rng.random() < 0.2:
        body = "- " + body.replace(". ", ".\n- ")
    n = len(body.split()) if lang == "ko" else len(re.findall(r"\w+", body))
    relation, k = threshold(rng, n)
    kwargs = {"num_words": k, "relation": relation}
    return Case("length_constraints:number_words", lang, kwargs, body, known=known)


@template(SENTENCE_ID)
def _sentence_count(rng: random.Random, lang: str) -> Case:
    k = rng.randint(1, 4)
    relation, threshold_ = threshold(rng, k)
    kwargs = {"num_sentences": threshold_, "relation": relation}
    return Case(SENTENCE_ID, lang, kwargs, text(rng, lang, k))


@template("length_constraints:number_paragraphs")
def _paragraphs(rng: random.Random, lang: str) -> Case:
    m = rng.randint(1, 4)
    parts = [text(rng, lang) for _ in range(m)]
    divider = rng.choice([" *** ", "\n***\n", "\n\n***\n\n", "***", "\n* * *\n"])
    body = divider.join(parts)
    if rng.random() < 0.2:
        body = "***\n" + body
    if rng.random() < 0.2:
        body += "\n***"
    if m > 1 and rng.random() < 0.15:
        body = body.replace(divider, divider + "***" + divider, 1)
    want = max(1, m + rng.choice((-1, 0, 0, 1)))
    return Case("length_constraints:number_paragraphs", lang, {"num_paragraphs": want}, body)


@template("length_constraints:nth_paragraph_first_word")
def _first_word(rng: random.Random, lang: str) -> Case:
    m = rng.randint(1, 4)
    parts = [text(rng, lang) for _ in range(m)]
    body = rng.choice(["\n\n", "\n\n", "\n\n\n", "\n"]).join(parts)
    nth = rng.randint(1, m)
    first = parts[nth - 1].split()[0]
    if lang == "ko":
        choice = rng.random()
        if choice < 0.3:  # the word without its particle or ending
            first = first[:-1] or first
        elif choice < 0.45:  # another word
            first = rng.choice([w for w in WORDS[lang] if not first.startswith(w)])
    else:
        first = re.split(r"[.,?!'\"]", first)[0]
        if rng.random() < 0.3:
            first = rng.choice([first[:-1] or first, rng.choice(WORDS[lang])])
        first = rng.choice([first, first.lower(), first.upper()])
    # A Korean word that starts a line (a paragraph, once loose drops a line) with more after it
    starts = [line.split()[0] for line in body.split("\n") if line.strip()]
    korean_prefix = lang == "ko" and any(w.startswith(first) and w != first for w in starts)
    known = KO_FIRST_WORD if korean_prefix else None
    want = max(1, m + rng.choice((-1, 0, 0, 0)))
    kwargs = {"num_paragraphs": want, "nth_paragraph": min(nth, want), "first_word": first}
    return Case("length_constraints:nth_paragraph_first_word", lang, kwargs, body, known=known)


@template("detectable_content:number_placeholders")
def _placeholders(rng: random.Random, lang: str) -> Case:
    n = rng.randint(0, 4)
    words = text(rng, lang).split()
    for _ in range(n):
        words.insert(rng.randint(0, len(words)), rng.choice(PLACEHOLDERS[lang]))
    kwargs = {"num_placeholders": max(1, n + rng.choice((-1, 0, 1)))}
    return Case("detectable_content:number_placeholders", lang, kwargs, " ".join(words))


@template("detectable_content:postscript")
def _postscript(rng: random.Random, lang: str) -> Case:
    marker = rng.choice(["P.S.", "P.P.S"] + (["추신"] if lang == "ko" else ["Note"]))
    written = rng.choice(["P.S.", "P.P.S.", "p.s.", "P. S.", "P.P.S", "PS", "추신:", "Note:", ""])
    body = text(rng, lang) + rng.choice(["\n\n", "\n", " "]) + written + " " + text(rng, lang, 1)
    return Case("detectable_content:postscript", lang, {"postscript_marker": marker}, body)


@template("detectable_format:number_bullet_lists")
def _bullet_lists(rng: random.Random, lang: str) -> Case:
    lines, n = [], 0
    for _ in range(rng.randint(1, 6)):
        mark = rng.choice(["* ", "- ", "  * ", "-", "*", "1. ", "• ", "**굵게** ", ""])
        n += mark.strip() in ("*", "-")
        lines.append(mark + text(rng, lang, 1))
    if rng.random() < 0.2:
        lines.insert(rng.randint(0, len(lines)), "---")
        n += 1
    kwargs = {"num_bullets": max(1, n + rng.choice((-1, 0, 0, 1)))}
    return Case("detectable_format:number_bullet_lists", lang, kwargs, "\n".join(lines))


@template("detectable_format:number_highlighted_sections")
def _highlighted(rng: random.Random, lang: str) -> Case:
    words, n = text(rng, lang, 2).split(), 0
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(len(words))
        stars = rng.choice(["*", "**", "***"])
        words[i] = stars + words[i] + stars
        n += 1
    kwargs = {"num_highlights": max(1, n + rng.choice((-1, 0, 1)))}
    return Case("detectable_format:number_highlighted_sections", lang, kwargs, " ".join(words))


@template("detectable_format:multiple_sections")
def _sections(rng: random.Random, lang: str) -> Case:
    splitter, m = rng.choice(SPLITTERS[lang]), rng.randint(1, 4)
    written = rng.choice([splitter, splitter, splitter.lower()])
    sep = rng.choice([" ", "", "\n"])
    body = "\n".join(f"{written}{sep}{i}\n{text(rng, lang, 1)}" for i in range(1, m + 1))
    kwargs = {"section_spliter": splitter, "num_sections": max(1, m + rng.choice((-1, 0, 1)))}
    return Case("detectable_format:multiple_sections", lang, kwargs, body)


@template("detectable_format:json_format")
def _json(rng: random.Random, lang: str) -> Case:
    value = {"answer": text(rng, lang, 1), "n": rng.randint(0, 9)}
    body = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
    fence = rng.choice(["", "```json\n", "```JSON\n", "```Json\n", "```\n", "Here:\n"])
    body = fence + body + ("\n```" if fence.startswith("```") else "")
    if rng.random() < 0.2:
        body = body[:-2]
    return Case("detectable_format:json_format", lang, {}, body)


@template("detectable_format:title")
def _titled(rng: random.Random, lang: str) -> Case:
    title = rng.choice(["<<{t}>>", "<< {t} >>", "<<>>", "<< >>", "《{t}》", "<{t}>", "<<{t}\n>>"])
    head = title.format(t=text(rng, lang, 1).rstrip(".!?"))
    return Case("detectable_format:title", lang, {}, head + "\n" + text(rng, lang))


@template("combination:two_responses")
def _two(rng: random.Random, lang: str) -> Case:
    answers = [text(rng, lang, 1) for _ in range(rng.choice([1, 2, 2, 3]))]
    if len(answers) == 2 and rng.random() < 0.2:
        answers[1] = answers[0]
    sep = rng.choice(["\n******\n", "******", "\n*****\n", "\n*******\n"])
    body = sep.join(answers)
    if rng.random() < 0.15:
        body = rng.choice(["******\n" + body, body + "\n******", body.replace(sep, sep * 2, 1)])
    return Case("combination:two_responses", lang, {}, body)


@template("combination:repeat_prompt")
def _repeat(rng: random.Random, lang: str) -> Case:
    prompt = PROMPTS[lang]
    start = rng.choice([prompt, prompt.lower(), " " + prompt, prompt[:-3], text(rng, lang, 1)])
    body = start + rng.choice(["\n", " "]) + text(rng, lang)
    return Case(
        "combination:repeat_prompt", lang, {"prompt_to_repeat": prompt}, body, prompt=prompt
    )


@template("startend:end_checker")
def _end(rng: random.Random, lang: str) -> Case:
    phrase = END_PHRASES[lang]
    end = rng.choice([phrase, phrase.lower(), phrase + '"', phrase + "  \n", phrase[:-1], ""])
    body = rng.choice(["", '"']) + text(rng, lang) + " " + end
    return Case("startend:end_checker", lang, {"end_phrase": phrase}, body)


@template("startend:quotation")
def _quoted(rng: random.Random, lang: str) -> Case:
    left, right = rng.choice([('"', '"'), ('"', ""), ("", '"'), ("", ""), ("'", "'")])
    body = rng.choice(["", " ", "\n"]) + left + text(rng, lang) + right + rng.choice(["", "\n"])
    return Case("startend:quotation", lang, {}, body)


@template("punctuation:no_comma")
def _commas(rng: random.Random, lang: str) -> Case:
    words = text(rng, lang, 2).replace(",", "").split()
    for _ in range(rng.choice([0, 0, 1, 2])):
        i = rng.randrange(len(words))
        words[i] += ","
    return Case("punctuation:no_comma", lang, {}, " ".join(words))


# Symbol soup: short strings of the characters and words the checkers look for, no Hangul. They
# probe the language-independent rules (dividers, markers, fences, quotes) where hand-written
# cases would not think to look. One fixed set of kwargs per type.
SOUP_PARTS = [
    *"ab ", "\n", "\n\n", "\t", "  ", "*", "**", "***", "******", "-", " - ", '"', "'", "<<",
    ">>", "[", "]", ",", ".", "!", "?", "{", "}", "```json", "```", "P.S.", "p. s.", "P.P.S",
    "apple", "Apple", "the", "The", "Section 1", "SECTION 2", "3.5", "don't", END_PHRASES["en"],
    PROMPTS["en"],
]  # fmt: skip
SOUP_KWARGS = {
    "keywords:existence": {"keywords": ["apple", "the"]},
    "keywords:frequency": {"keyword": "apple", "frequency": 2, "relation": "at least"},
    "keywords:forbidden_words": {"forbidden_words": ["apple", "the"]},
    "keywords:letter_frequency": {"letter": "a", "let_frequency": 3, "let_relation": "less than"},
    "language:response_language": {"language": "ko"},
    "length_constraints:number_words": {"num_words": 5, "relation": "at least"},
    SENTENCE_ID: {"num_sentences": 2, "relation": "at least"},
    "length_constraints:number_paragraphs": {"num_paragraphs": 2},
    "length_constraints:nth_paragraph_first_word": {
        "num_paragraphs": 2,
        "nth_paragraph": 2,
        "first_word": "the",
    },
    "detectable_content:number_placeholders": {"num_placeholders": 1},
    "detectable_content:postscript": {"postscript_marker": "P.S."},
    "detectable_format:number_bullet_lists": {"num_bullets": 2},
    "detectable_format:number_highlighted_sections": {"num_highlights": 2},
    "detectable_format:multiple_sections": {"section_spliter": "Section", "num_sections": 1},
    "detectable_format:json_format": {},
    "detectable_format:title": {},
    "combination:two_responses": {},
    "combination:repeat_prompt": {"prompt_to_repeat": PROMPTS["en"]},
    "startend:end_checker": {"end_phrase": END_PHRASES["en"]},
    "startend:quotation": {},
    "punctuation:no_comma": {},
}


def soup(per_type: int, seed: int = 0) -> Iterator[Case]:
    for instruction_id, kwargs in SOUP_KWARGS.items():
        rng = random.Random(f"{seed}:soup:{instruction_id}")
        for _ in range(per_type):
            response = "".join(rng.choice(SOUP_PARTS) for _ in range(rng.randint(0, 14)))
            yield Case(instruction_id, "en", kwargs, response, prompt=PROMPTS["en"], label="soup")


def variations(per_type: int, seed: int = 0) -> Iterator[Case]:
    for instruction_id, build in TEMPLATES.items():
        rng = random.Random(f"{seed}:{instruction_id}")
        for i in range(per_type):
            yield build(rng, ("ko", "en")[i % 2])


def cases(per_type: int = 30, seed: int = 0, soup_per_type: int | None = None) -> list[Case]:
    """Every hand-written case, `per_type` seeded variations of each type (half Korean) and
    `soup_per_type` symbol-soup responses (as many as variations unless given)."""
    n_soup = per_type if soup_per_type is None else soup_per_type
    return list(hand_written()) + list(variations(per_type, seed)) + list(soup(n_soup, seed))


# ---------------------------------------------------------------------------------------------
# The two checkers
# ---------------------------------------------------------------------------------------------


def load_reference():
    """lm-eval's IFEval scoring module, or ImportError. It downloads nltk's punkt_tab when it is
    missing: a rank other than 0 skips that, so nothing here reaches the network."""
    import nltk  # noqa: F401  (an ImportError here names the missing package)

    previous = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = "1"
    try:
        import langdetect
        from lm_eval.tasks.ifeval import utils
    finally:
        if previous is None:
            del os.environ["LOCAL_RANK"]
        else:
            os.environ["LOCAL_RANK"] = previous
    langdetect.DetectorFactory.seed = 0  # langdetect samples at random: make it repeatable
    # lm-eval logs an error for each response without letters (which it counts as followed)
    logging.getLogger("lm_eval.tasks.ifeval.instructions").setLevel(logging.CRITICAL)
    return utils


def punkt_available() -> bool:
    try:
        import nltk

        nltk.data.find("tokenizers/punkt_tab/english/")
    except (ImportError, LookupError):
        return False
    return True


def comparable(all_cases: list[Case]) -> list[Case]:
    """The cases lm-eval can score here: sentence counts only with nltk's punkt_tab data."""
    if punkt_available():
        return all_cases
    return [c for c in all_cases if c.instruction_id != SENTENCE_ID]


def reference(utils, case: Case, mode: str) -> bool:
    example = utils.InputExample(
        key=0,
        instruction_id_list=[case.instruction_id],
        prompt=case.prompt,
        kwargs=[dict(case.kwargs)],
    )
    score = (
        utils.test_instruction_following_strict
        if mode == "strict"
        else (utils.test_instruction_following_loose)
    )
    return score(example, case.response).follow_instruction_list[0]


def ours(case: Case, mode: str) -> bool | None:
    score = check if mode == "strict" else check_loose
    return score(case.instruction_id, case.kwargs, case.response, case.prompt)


@dataclass
class Outcome:
    case: Case
    hanlm: dict[str, bool | None] = field(default_factory=dict)
    lm_eval: dict[str, bool] = field(default_factory=dict)

    def agrees(self, mode: str) -> bool:
        return self.hanlm[mode] == self.lm_eval[mode]

    @property
    def unexpected(self) -> list[str]:
        """Modes where the two differ on a case that has no documented reason to."""
        return [m for m in ("strict", "loose") if not self.agrees(m) and not self.case.known]


def compare(all_cases: list[Case], utils) -> list[Outcome]:
    outcomes = []
    for case in all_cases:
        outcome = Outcome(case)
        for mode in ("strict", "loose"):
            outcome.hanlm[mode] = ours(case, mode)
            outcome.lm_eval[mode] = reference(utils, case, mode)
        outcomes.append(outcome)
    return outcomes


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _rate(outcomes: list[Outcome], mode: str, lang: str | None = None) -> str:
    chosen = [o for o in outcomes if lang is None or o.case.lang == lang]
    if not chosen:
        return "–"
    agreed = sum(o.agrees(mode) for o in chosen)
    if agreed == len(chosen):
        return "100%"
    return f"{math.floor(1000 * agreed / len(chosen)) / 10:.1f}%"  # never rounds up to 100%


def table(outcomes: list[Outcome]) -> str:
    by_type: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_type[o.case.instruction_id].append(o)
    lines = [
        "| instruction type | cases ko / en+soup | lm-eval pass/fail | strict ko | strict en "
        "| loose ko | loose en | disagreements (strict, loose) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for instruction_id in sorted(by_type):
        group = by_type[instruction_id]
        n_ko = sum(o.case.lang == "ko" for o in group)
        n_soup = sum(o.case.label == "soup" for o in group)
        passed = sum(o.lm_eval["strict"] for o in group)
        reasons: Counter[str] = Counter()
        for o in group:
            for mode in ("strict", "loose"):
                if not o.agrees(mode):
                    reasons[(o.case.known or "UNEXPECTED", mode)] += 1
        why = "; ".join(
            f"{reason}: {reasons[(reason, 'strict')]}, {reasons[(reason, 'loose')]}"
            for reason in dict.fromkeys(r for r, _ in reasons)
        )
        lines.append(
            f"| `{instruction_id}` | {n_ko} / {len(group) - n_ko - n_soup}+{n_soup} "
            f"| {passed}/{len(group) - passed} "
            f"| {_rate(group, 'strict', 'ko')} | {_rate(group, 'strict', 'en')} "
            f"| {_rate(group, 'loose', 'ko')} | {_rate(group, 'loose', 'en')} | {why or '–'} |"
        )
    n_ko = sum(o.case.lang == "ko" for o in outcomes)
    n_soup = sum(o.case.label == "soup" for o in outcomes)
    passed = sum(o.lm_eval["strict"] for o in outcomes)
    lines.append(
        f"| **all** | {n_ko} / {len(outcomes) - n_ko - n_soup}+{n_soup} "
        f"| {passed}/{len(outcomes) - passed} | {_rate(outcomes, 'strict', 'ko')} "
        f"| {_rate(outcomes, 'strict', 'en')} | {_rate(outcomes, 'loose', 'ko')} "
        f"| {_rate(outcomes, 'loose', 'en')} | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variations", type=int, default=30, help="seeded cases per type")
    parser.add_argument("--soup", type=int, default=100, help="symbol-soup cases per type")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="disagreeing cases shown per reason")
    args = parser.parse_args(argv)

    utils = load_reference()
    generated = cases(args.variations, args.seed, args.soup)
    chosen = comparable(generated)
    outcomes = compare(chosen, utils)
    print(table(outcomes))
    if len(chosen) < len(generated):
        print(
            f"\nnot compared: {SENTENCE_ID} ({len(generated) - len(chosen)} cases): "
            "lm-eval needs nltk's punkt_tab data, which is not installed"
        )
    shown: Counter[str] = Counter()
    print("\nexamples of disagreement (hanlm / lm-eval, strict):")
    for o in outcomes:
        if o.agrees("strict") and o.agrees("loose"):
            continue
        reason = o.case.known or "UNEXPECTED"
        if shown[reason] >= args.show and reason != "UNEXPECTED":
            continue
        shown[reason] += 1
        print(
            f"  [{reason}] {o.case.instruction_id} {json.dumps(o.case.kwargs, ensure_ascii=False)} "
            f"{o.case.response!r}: {o.hanlm['strict']} / {o.lm_eval['strict']}"
        )
    unexpected = [o for o in outcomes if o.unexpected]
    print(f"\n{len(outcomes)} cases, {len(unexpected)} with an unexplained disagreement")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
