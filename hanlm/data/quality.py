"""Quality filters for Korean web text: keep or drop one document, and say why.

`QualityFilter(section).reason(text)` returns the name of the first failing check, a stable
snake_case name counted in `corpus/stats.json`, or None to keep the document. The text given is
already NFC-normalised, stripped, without control characters.

The statistics are those of the FineWeb-2 filtering pipeline (huggingface/fineweb-2,
`fineweb-2-pipeline.py`: datatrove's GopherRepetitionFilter and FineWebQualityFilter run with the
per-language values of `configs/kor_Hang.yml`), written again here for speed, plus two checks of
our own: the Hangul share of letters (in place of FineWeb-2's GlotLID language score) and a
Korean web boilerplate share (C4's line rules adapted to Korean sites; FineWeb-2 uses no C4 rule).
Where a definition differs from datatrove's, the difference is said at the check. The thresholds,
their sources and what was changed for Korean are in `CorpusQualitySection` (hanlm/config/data.py).

Words are whitespace-separated (Korean eojeol), where FineWeb-2 splits Korean into morphemes with
Kiwi; the word-based thresholds are re-derived for eojeols (see the config section).

Order: cheapest checks first, so that most dropped documents cost little and a kept document
costs one pass per statistic, with early exits where a statistic cannot fail.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hanlm.config import CorpusQualitySection

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")

# Sentence-final punctuation a line may end with (FineWeb's line_punct check; datatrove's
# TERMINAL_PUNCTUATION less the scripts Korean text does not use). Korean prose ends in `.`.
TERMINAL_PUNCTUATION = tuple(".!?。！？．｡‼‽⁇⁈⁉﹒﹖﹗")

# Korean web boilerplate. Strong markers: copyright and redistribution notices, site policy
# links, cookie and JavaScript notices (C4's `javascript` line rule), placeholder text, code
# braces (C4's `{` rule, here per line). Navigation words count only on a short line, where they
# are menu items rather than prose.
_BOILERPLATE_STRONG = (
    r"무단\s*전재|재\s*배포\s*금지|저작권자\s*(?:[ⓒ©]|\(c\))|copyright|all rights reserved|ⓒ|©"
    r"|개인\s*정보\s*(?:처리|취급)\s*방침|이용\s*약관|서비스\s*약관|이메일\s*무단\s*수집"
    r"|javascript|자바\s*스크립트|쿠키를?\s*(?:사용|허용|설정)"
    r"|(?:use|accept|allow)s?\s+cookies|cookie\s+(?:policy|settings)"
    r"|lorem ipsum|[{}]"
)
_BOILERPLATE_NAV = (
    r"로그인|로그아웃|회원\s*가입|아이디\s*찾기|비밀번호\s*찾기|고객\s*센터|사이트\s*맵"
    r"|바로\s*가기|전체\s*메뉴|이전\s*글|다음\s*글|목록\s*보기|공유\s*하기|구독\s*하기|좋아요|댓글"
    r"|기사\s*제보|인쇄\s*하기|스크랩|top\s*$|맨\s*위로"
)
_BOILERPLATE_ANY = re.compile(f"{_BOILERPLATE_STRONG}|{_BOILERPLATE_NAV}", re.IGNORECASE)
_BOILERPLATE_STRONG_RE = re.compile(_BOILERPLATE_STRONG, re.IGNORECASE)
NAV_LINE_CHARS = 30  # a navigation word makes a line boilerplate only up to this length
BOILERPLATE_LINE_CHARS = 200  # a longer line is prose, whatever it mentions


@lru_cache(maxsize=1)
def _letter_table() -> np.ndarray:
    """Per code point: 0 not a letter, 1 a letter (str.isalpha), 2 Hangul (syllable or jamo)."""
    table = np.zeros(0x110000, dtype=np.uint8)
    table[[c for c in range(0x110000) if chr(c).isalpha()]] = 1
    for lo, hi in ((0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F)):
        table[lo : hi + 1] = 2
    table[0xD7B0:0xD800] = 2
    return table


def korean_share(text: str) -> float:
    """Hangul (syllables and jamo) among letters; digits, punctuation, spaces, symbols excluded.
    0.0 for a text without letters."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    counts = np.bincount(_letter_table()[codes], minlength=3)
    letters = int(counts[1]) + int(counts[2])
    return int(counts[2]) / letters if letters else 0.0


def is_boilerplate_line(line: str) -> bool:
    if len(line) > BOILERPLATE_LINE_CHARS:
        return False
    if len(line) <= NAV_LINE_CHARS:
        return _BOILERPLATE_ANY.search(line) is not None
    return _BOILERPLATE_STRONG_RE.search(line) is not None


def boilerplate_share(lines: list[str]) -> float:
    """Characters of boilerplate lines among the characters of all lines."""
    total = sum(map(len, lines))
    if total == 0:
        return 0.0
    return sum(len(line) for line in lines if is_boilerplate_line(line)) / total


def duplicates(items: list[str]) -> tuple[int, int]:
    """(repeated items, their characters): each occurrence after an item's first one counts."""
    counts = Counter(items)
    if len(counts) == len(items):
        return 0, 0
    repeated = [(item, count - 1) for item, count in counts.items() if count > 1]
    return sum(c for _, c in repeated), sum(len(item) * c for item, c in repeated)


def top_ngram_chars(words: list[str], n: int) -> int:
    """Characters of the most frequent word n-gram times its count, the n-gram written with its
    n-1 spaces (Gopher's top n-gram statistic, as datatrove's find_top_duplicate measures it)."""
    grams = Counter(zip(*(words[i:] for i in range(n)), strict=False))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    if count == 1:
        return 0  # nothing repeats: no n-gram can take a share worth filtering on
    return (sum(map(len, gram)) + n - 1) * count


def duplicate_ngram_chars(words: list[str], n: int, lengths: list[int]) -> int:
    """Characters (spaces excluded) of the words covered by a repeated word n-gram, each word
    counted once: an n-gram occurrence after its first one covers its n words.

    Gopher's "fraction of characters in duplicate n-grams" (Rae et al. 2021, Table A1), measured
    as the union of repeated spans. datatrove's find_all_duplicate measures it greedily (after a
    repeat it jumps n words without registering the n-grams inside), which can count a little
    less on overlapping repeats; on the documents the thresholds are meant for the two agree."""
    grams = list(zip(*(words[i:] for i in range(n)), strict=False))
    if len(set(grams)) == len(grams):
        return 0
    first: dict[tuple[str, ...], int] = {}
    covered = bytearray(len(words))
    one = b"\x01" * n
    for i, gram in enumerate(grams):
        if first.setdefault(gram, i) != i:
            covered[i : i + n] = one
    return sum(length for length, c in zip(lengths, covered, strict=True) if c)


class QualityFilter:
    """Keep/drop decisions of the `[corpus.quality]` checks; a threshold of 0 turns its check off
    (and a `min_` threshold of 0, which nothing falls below)."""

    def __init__(self, section: CorpusQualitySection) -> None:
        self.section = section
        self.enabled = section.enabled
        self.top_ngrams = [(n, t) for n, t in section.top_ngram_shares() if t > 0]
        self.dup_ngrams = [(n, t) for n, t in section.duplicate_ngram_shares() if t > 0]
        # the repeated-span share cannot grow with n: below the smallest threshold at the smallest
        # n, no n fails
        self.dup_floor = min((t for _, t in self.dup_ngrams), default=1.0)

    def reason(self, text: str) -> str | None:
        """The name of the first check `text` fails, or None to keep it."""
        if not self.enabled:
            return None
        quality_cfg = self.section
        n_chars = len(text)
        if n_chars == 0:
            return "empty"
        if quality_cfg.min_korean_share > 0 and korean_share(text) < quality_cfg.min_korean_share:
            return "not_korean"

        n_breaks = text.count("\n")
        lines = [line for line in text.split("\n") if line] if n_breaks else [text]
        if quality_cfg.max_boilerplate_share > 0:
            # only lines short enough to be boilerplate are searched: prose lines cost nothing
            short = [line for line in lines if len(line) <= BOILERPLATE_LINE_CHARS]
            if (
                short
                and _BOILERPLATE_ANY.search("\n".join(short)) is not None
                and boilerplate_share(lines) > quality_cfg.max_boilerplate_share
            ):
                return "boilerplate"

        if len(lines) > 1:
            failed = self._line_checks(text, lines, n_breaks)
            if failed:
                return failed

        words = text.split()
        n_words = len(words)
        if (
            quality_cfg.max_line_breaks_per_word > 0
            and n_breaks > quality_cfg.max_line_breaks_per_word * max(n_words, 1)
        ):
            return "line_breaks"
        if n_words < 2 or not (self.top_ngrams or self.dup_ngrams):
            return None

        # Bounds from word counts, which most documents stop at. An n-gram's occurrences hold
        # occurrences of its n words, so its characters times its count are at most n times the
        # largest (word characters x count) plus its n-1 spaces per occurrence; and a word in a
        # repeated n-gram occurrence is a repeated word occurrence.
        counts = Counter(words)
        if len(counts) == n_words:
            return None  # no word repeats: no n-gram repeats
        top_mass = max(len(w) * c for w, c in counts.items())
        top_count = max(counts.values())
        for n, share in self.top_ngrams:
            bound = n * top_mass + (n - 1) * top_count
            if (
                bound > share * n_chars
                and n_words > n
                and top_ngram_chars(words, n) > share * n_chars
            ):
                return "top_ngram_share"
        if self.dup_ngrams and n_words >= self.dup_ngrams[0][0]:
            repeated_words = sum(len(w) * (c - 1) for w, c in counts.items() if c > 1)
            if repeated_words <= self.dup_floor * n_chars:
                return None
            lengths = list(map(len, words))
            for k, (n, share) in enumerate(self.dup_ngrams):
                repeated = duplicate_ngram_chars(words, n, lengths)
                if repeated > share * n_chars:
                    return "duplicate_ngram_share"
                if k == 0 and repeated <= self.dup_floor * n_chars:
                    break
        return None

    def _line_checks(self, text: str, lines: list[str], n_breaks: int) -> str | None:
        """Paragraph and line checks, for a document of more than one line."""
        quality_cfg = self.section
        n_chars = len(text)
        if "\n\n" in text and (
            quality_cfg.max_repeated_paragraph_share > 0
            or quality_cfg.max_repeated_paragraph_chars > 0
        ):
            paragraphs = _PARAGRAPH_BREAK.split(text)
            dup, dup_chars = duplicates(paragraphs)
            if quality_cfg.max_repeated_paragraph_share > 0 and dup > (
                quality_cfg.max_repeated_paragraph_share * len(paragraphs)
            ):
                return "repeated_paragraphs"
            if quality_cfg.max_repeated_paragraph_chars > 0 and dup_chars > (
                quality_cfg.max_repeated_paragraph_chars * n_chars
            ):
                return "repeated_paragraph_chars"

        dup, dup_chars = duplicates(lines)
        if (
            quality_cfg.max_repeated_line_share > 0
            and dup > quality_cfg.max_repeated_line_share * len(lines)
        ):
            return "repeated_lines"
        # FineWeb's char_dup_ratio: repeated line characters over the characters less "\n"
        if (
            quality_cfg.max_repeated_line_chars > 0
            and dup_chars > quality_cfg.max_repeated_line_chars * (n_chars - n_breaks)
        ):
            return "repeated_line_chars"

        # FineWeb's line_punct_ratio, on documents of two lines or more: a one-line document
        # has no line structure to judge (datatrove drops it when it does not end a sentence)
        if quality_cfg.min_line_punctuation_share > 0:
            ended = sum(1 for line in lines if line.endswith(TERMINAL_PUNCTUATION))
            if ended < quality_cfg.min_line_punctuation_share * len(lines):
                return "line_punctuation"
        if quality_cfg.max_short_line_share < 1:
            short = sum(1 for line in lines if len(line) <= quality_cfg.short_line_chars)
            if short > quality_cfg.max_short_line_share * len(lines):
                return "short_lines"
        return None
