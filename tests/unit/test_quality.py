"""Quality filters for Korean web text (hanlm/data/quality.py, [corpus.quality])."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from conftest import korquad_contexts
from hanlm.config import Config, CorpusQualitySection, load_config
from hanlm.data.quality import QualityFilter, korean_share
from hanlm.errors import UserError

PROSE = (
    "세종대왕은 조선의 제4대 임금으로, 훈민정음을 창제하여 백성이 글을 쉽게 익히도록 하였다. "
    "그는 집현전을 설치하여 학자들을 모으고 농업과 과학 기술의 발전에도 힘썼다. "
    "측우기와 해시계 같은 발명품이 그의 재위 기간에 만들어졌으며, 음악과 법률 제도도 정비되었다. "
    "오늘날 한국 사람들은 그를 가장 존경하는 역사 인물 가운데 하나로 꼽는다."
)
PROSE_LINES = (
    "서울은 대한민국의 수도이며 가장 큰 도시이다.\n"
    "한강이 도시의 가운데를 흐르고, 북한산과 관악산이 도시를 둘러싸고 있다.\n"
    "조선 시대부터 수도였기 때문에 경복궁과 창덕궁 같은 궁궐이 남아 있다.\n"
    "지하철과 버스가 잘 갖추어져 있어 시민들은 대중교통을 많이 이용한다."
)


def on(**thresholds: float) -> QualityFilter:
    return QualityFilter(CorpusQualitySection(enabled=True, **thresholds))


def test_normal_korean_prose_kept() -> None:
    f = on()
    assert f.reason(PROSE) is None
    assert f.reason(PROSE_LINES) is None
    assert f.reason(PROSE + "\n\n" + PROSE_LINES) is None


def test_disabled_keeps_everything() -> None:
    f = QualityFilter(CorpusQualitySection())
    assert not f.enabled
    for text in ("Only English here.", "로그인\n로그인\n로그인", "스팸 " * 500, PROSE):
        assert f.reason(text) is None


def test_korean_share() -> None:
    assert korean_share("한국어") == 1.0
    assert korean_share("English") == 0.0
    assert korean_share("12345 !?") == 0.0  # no letters
    assert korean_share("ㄱㄴㄷ ㅏㅑ") == 1.0  # jamo count as Hangul
    assert korean_share("한국 ab") == pytest.approx(0.5)


def test_english_and_chinese_are_not_korean() -> None:
    f = on()
    english = (
        "The quick brown fox jumps over the lazy dog. This document is written entirely in "
        "English and should not be part of a Korean corpus, whatever its quality."
    )
    chinese = (
        "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。这座城市有三千多年的历史。"
    )
    japanese = (
        "東京は日本の首都であり、世界でも有数の大都市である。多くの人々がここで暮らしている。"
    )
    for text in (english, chinese, japanese):
        assert f.reason(text) == "not_korean"


def test_mixed_korean_with_english_words_kept() -> None:
    f = on()
    text = (
        "오늘 회의에서 우리는 새로운 machine learning 모델과 GPU cluster 구성에 대해 이야기했다. "
        "다음 주에는 deploy 일정을 정하고, API 문서를 README에 정리하기로 했다."
    )
    assert f.reason(text) is None


def test_repeated_lines() -> None:
    doc = "\n".join(["오늘의 특가 상품을 확인하세요."] * 6 + PROSE_LINES.split("\n"))
    assert on().reason(doc) == "repeated_lines"


def test_repeated_line_chars() -> None:
    # one long line repeated once: few repeated lines, many repeated characters
    long_line = PROSE
    doc = "\n".join([long_line, *PROSE_LINES.split("\n"), long_line])
    assert on().reason(doc) == "repeated_line_chars"
    assert on(max_repeated_line_share=0.1).reason(doc) == "repeated_lines"  # 1 line in 6


def test_repeated_paragraphs() -> None:
    para = "새 소식을 알려 드립니다.\n다음 주에 다시 만나요."
    doc = "\n\n".join([para] * 3 + [PROSE])
    assert on().reason(doc) == "repeated_paragraphs"


def test_repeated_paragraph_chars() -> None:
    doc = "\n\n".join([PROSE, PROSE_LINES, "짧은 문단 하나.", "또 다른 문단이다.", PROSE])
    assert on().reason(doc) == "repeated_paragraph_chars"


def test_line_punctuation() -> None:
    menu = "\n".join(
        ["홈", "회사 소개", "제품 안내", "고객 지원", "채용 정보", "오시는 길", "자주 묻는 질문"]
        * 3
    )
    assert on(max_repeated_line_share=0, max_repeated_line_chars=0).reason(menu) in (
        "line_punctuation",
        "boilerplate",
    )
    headings = "\n".join(f"{i}장 한국의 역사와 문화 이야기 제{i}편" for i in range(20))
    assert on().reason(headings) == "line_punctuation"
    # one line is not judged by its ending: a truncated paragraph is kept
    assert on().reason(PROSE.rstrip(".")) is None


def test_short_lines_off_by_default_and_on_when_set() -> None:
    words = PROSE.replace(".", "").split()
    doc = "\n".join(" ".join(words[i : i + 3]) + "." for i in range(0, len(words) - 2, 3))
    assert on().reason(doc) is None
    assert on(max_short_line_share=0.67).reason(doc) == "short_lines"


def test_line_breaks() -> None:
    doc = "\n".join(f"항목{i}." for i in range(30))
    assert on().reason(doc) == "line_breaks"


def test_top_ngram_share() -> None:
    doc = PROSE + " " + " ".join(["최저가 할인"] * 40)
    assert on().reason(doc) == "top_ngram_share"


def test_duplicate_ngram_share() -> None:
    sentence = "이 제품은 정말 좋은 품질과 합리적인 가격으로 많은 고객에게 사랑받고 있습니다."
    doc = PROSE + " " + " ".join([sentence] * 4)
    assert on(top_2gram_share=0, top_3gram_share=0, top_4gram_share=0).reason(doc) == (
        "duplicate_ngram_share"
    )


def test_boilerplate() -> None:
    footer = "\n".join(
        [
            "로그인",
            "회원가입",
            "이용약관",
            "개인정보처리방침",
            "저작권자 © 한국일보 무단 전재 및 재배포 금지",
            "Copyright © 2024 All rights reserved.",
        ]
    )
    assert on().reason("짧은 공지입니다.\n" + footer) == "boilerplate"
    # an article with its copyright line is kept
    article = PROSE + "\n" + PROSE_LINES + "\n저작권자 © 한국일보 무단 전재 및 재배포 금지"
    assert on().reason(article) is None
    # prose that mentions a marker word is not boilerplate
    assert (
        on().reason("곡을 연주할 권한은 저작권자로부터 얻어야 하며, 회원가입 절차는 없다.") is None
    )


def test_threshold_zero_turns_a_check_off() -> None:
    doc = "\n".join(["오늘의 특가 상품을 확인하세요."] * 6 + PROSE_LINES.split("\n"))
    f = on(max_repeated_line_share=0, max_repeated_line_chars=0, dup_5gram_share=0)
    assert f.reason(doc) != "repeated_lines"


@pytest.mark.parametrize(
    ("key", "value"),
    [("min_korean_share", 1.5), ("max_repeated_line_share", -0.1), ("short_line_chars", 0)],
)
def test_bad_thresholds_rejected(tmp_path: Path, key: str, value: float) -> None:
    path = tmp_path / "run.toml"
    path.write_text(f"[corpus.quality]\nenabled = true\n{key} = {value}\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert f"corpus.quality.{key}" in str(err.value)


def test_config_section_defaults() -> None:
    q = Config().corpus.quality
    assert q.enabled is False
    assert q.max_repeated_line_share == pytest.approx(0.374)  # FineWeb-2 kor_Hang dup_line_frac
    assert q.min_line_punctuation_share == pytest.approx(0.062)  # kor_Hang line_punct_thr
    assert [n for n, _ in q.duplicate_ngram_shares()] == [5, 6, 7, 8, 9, 10]


# --- real Korean text ----------------------------------------------------------------------------


def _boolq_passages(shared: Path) -> list[str]:
    csv.field_size_limit(1 << 28)
    texts: list[str] = []
    for split in ("train", "dev"):
        path = shared / "kobest" / "BoolQ" / f"{split}.tsv"
        with open(path, encoding="utf-8", newline="") as f:
            texts += [
                row["Text"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            ]
    return list(dict.fromkeys(t.strip() for t in texts if t.strip()))


def test_false_drops_on_real_korean_below_two_percent(shared_data: Path) -> None:
    f = on()
    for name, docs in (
        ("korquad", [c.strip() for c in korquad_contexts(shared_data)]),
        ("kobest_boolq", _boolq_passages(shared_data)),
    ):
        reasons = Counter(f.reason(t) for t in docs)
        dropped = len(docs) - reasons[None]
        assert dropped / len(docs) < 0.02, (name, reasons)


def test_real_paragraphs_stitched_into_spam_are_dropped(shared_data: Path) -> None:
    contexts = [c.strip() for c in korquad_contexts(shared_data)][:50]
    f = on()
    for text in contexts[:10]:
        assert f.reason("\n".join([text] * 3)) in ("repeated_lines", "repeated_line_chars")
        assert f.reason(" ".join([text] * 3)) == "duplicate_ngram_share"
