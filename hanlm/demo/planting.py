"""Planting benchmark items into the pretraining documents, in one of four styles, mirrored.

Decontamination then has real leaks to find (verbatim, respaced, repunctuated, or embedded in a
long unrelated document) and real non-leaks to leave alone. A leaked item is copied with its
answer several times, as a benchmark passage on the web is mirrored across sites and crawls:
each copy in the item's style, framed by its own site's header and footer (so that the corpus
stage's deduplication keeps the copies apart, as it keeps real mirrors with their boilerplate).
"""

from __future__ import annotations

import random

from hanlm.demo.encyclopedia import encyclopedia_entry
from hanlm.demo.everyday import diary, essay
from hanlm.demo.facts import Atlas
from hanlm.testsets.readers import item_text

PLANT_STYLES = ("verbatim", "spacing", "punctuation", "embedded")
# Copies of each leaked item: at least, at most. Memorising a passage takes a model this small
# about a hundred readings (copies times passes over the corpus): over a 1 MB world, in 360 steps
# (~5.5 passes), 6 to 12 copies made the leaked items score +0.10 higher than in the same recipe
# trained without them, 16 to 24 copies +0.27 to +0.30, and in 450 steps (~7 passes) +0.31; the
# demo's 240 steps over a 0.7 MB world (~4.6 passes, ~90 readings) give +0.36. The budget holds
# that many readings of ~40 items, not of 80.
MIRRORS = (16, 24)

_PUNCTUATION_SWAPS = {".": ("", "!", "…"), "?": ("", "?!"), ",": ("", ";"), "'": ("", '"')}

# The sites a leaked item is mirrored on, each with its own header and footer (numbers drawn per
# copy); a leak's copies are on different sites. Kept apart from every benchmark scenario's wording.
_SITES = (
    (
        "[문제 풀이 게시판] 읽기 문제 {n}번 (조회 {views})",
        "정답과 해설은 다음 페이지에 있습니다. 추천 {n2} · 공유하기",
    ),
    ("오늘의 읽기 문제 - {year}년 {month}월 {day}일", "출처: 온라인 문제집 {n}호 | 무단 전재 금지"),
    ("자료실 > 국어 > 읽기 > 문제 {n}", "이 문제가 도움이 되었나요? 좋아요 {n2} · 신고하기"),
    (
        "기출 문제 모음 {n}쪽 | 작성자 익명{n2}",
        "다음 문제 보기 ▶ 이전 문제 보기 ◀ (전체 {views}문제)",
    ),
    (
        "퀴즈 블로그 | {year}.{month}.{day} | 댓글 {n2}개",
        "댓글 {n2}개 · 조회수 {views} · {year}년 {month}월 작성",
    ),
    (
        "읽기 연습 문제 #{n} | 난이도 {n2}",
        "{year}년 {month}월 {day}일에 올린 글입니다. 퍼가실 때는 출처를 밝혀 주세요.",
    ),
    ("학습지 모음 > 초등 > 읽기 이해 ({n}/{views})", "인쇄하기 | 목록으로 | 맨 위로"),
    ("우리 반 숙제 게시판 - {month}월 {day}일 숙제", "선생님 확인: {month}/{day} · 제출 {n2}명"),
    ("[스크랩] 좋은 읽기 자료 모음 ({n})", "원문 보기 | 스크랩 {n2}회 | 카테고리: 공부"),
    ("중학 국어 지문 연습 제{n}회", "해설 강의는 회원만 볼 수 있습니다. 수강생 {views}명"),
    (
        "문해력 키우기 {n}일차 | {year}.{month}.{day}",
        "오늘도 수고했어요! 내일 {n2}일차에서 만나요.",
    ),
    (
        "질문 게시판 > 이 문제 답이 뭔가요? (답변 {n2})",
        "채택된 답변 · 도움이 됐어요 {n2} · 조회 {views}",
    ),
    ("[공유] 시험 대비 읽기 지문 {n}개 정리", "첨부파일 {n2}개 | 다운로드 {views}회"),
    ("방과 후 교실 자료 | {year}학년도 {month}월", "담당: 방과 후 교실 운영팀 · 문의는 쪽지로"),
    ("카페 > 학부모 모임 > 자료 공유 ({n})", "이 글을 {n2}명이 좋아합니다 · 댓글 쓰기"),
    ("온라인 학습방 제{n}강 복습 문제", "다음 강의: 제{n2}강 | 진도율 {n2}%"),
    ("독해력 테스트 {n}회차 - 정답 포함", "테스트 결과를 친구에게 공유해 보세요! 참여 {views}명"),
    (
        "[블로그] 아이와 함께 푸는 문제 ({year}.{month}.{day})",
        "공감 {n2} · 이웃 추가 · 이 블로그의 다른 글 {n}개",
    ),
    ("교재 부록 {n}쪽 · 확인 문제", "정답은 책 뒤쪽 해답지에 있습니다. (부록 {n2}쪽)"),
    ("스터디 그룹 공지 - 이번 주 풀이 문제 {n}번", "스터디원 {n2}명 · 마감 {month}월 {day}일"),
    ("아카이브 {year}/{month:02d} | 문서 번호 {views}", "보존 기간: 영구 | 열람 {n}회"),
    ("모바일 퀴즈 앱 공유 화면 #{n}", "앱에서 더 많은 문제 풀기 ▶ 누적 참여 {views}명"),
    ("[펌] 초등 읽기 문제 모음 - {n2}탄", "퍼온 곳: 교육 커뮤니티 | 원작자에게 감사드립니다"),
    (
        "국어 학습 위키 > 연습 문제 > 문항 {n}",
        "이 문서는 {year}년 {month}월 {day}일에 마지막으로 편집되었습니다.",
    ),
)
assert len(_SITES) >= MIRRORS[1]  # each copy of a leak on a site of its own


def choose_planted(
    rng: random.Random, items: list[dict], fraction: float, stratum: str | None = None
) -> None:
    """Mark round(fraction * n) items planted, spreading the four styles evenly over them.

    With `stratum` (an item field), each value of it gets its share of the planted items
    (largest remainder): a stratified draw. Kinds of item can differ a lot in difficulty (the
    demo's capitals against its continents), and a draw that happened to leak more of the easy
    kind would make the dirty items look easier than the clean ones before any leak is learned.
    """
    total = round(fraction * len(items))
    groups: dict[object, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(None if stratum is None else item[stratum], []).append(index)
    shares = {key: fraction * len(members) for key, members in groups.items()}
    counts = {key: int(share) for key, share in shares.items()}
    by_remainder = sorted(groups, key=lambda key: shares[key] - counts[key], reverse=True)
    for key in by_remainder[: total - sum(counts.values())]:
        counts[key] += 1
    chosen = [
        index for key, members in groups.items() for index in rng.sample(members, counts[key])
    ]
    for position, index in enumerate(chosen):
        items[index]["planted"] = True
        items[index]["plant_style"] = PLANT_STYLES[position % len(PLANT_STYLES)]


def mirror_sites(rng: random.Random) -> list[int]:
    """The sites a leaked item's copies go on: how many copies, and on which sites."""
    return rng.sample(range(len(_SITES)), rng.randint(*MIRRORS))


def _on_site(rng: random.Random, site: int, text: str) -> str:
    """The planted text between the site's header and footer."""
    numbers = {
        "n": rng.randint(1, 999),
        "n2": rng.randint(1, 99),
        "views": f"{rng.randint(100, 99_999):,}",
        "year": rng.randint(2012, 2025),
        "month": rng.randint(1, 12),
        "day": rng.randint(1, 28),
    }
    header, footer = (line.format(**numbers) for line in _SITES[site])
    return "\n".join([header, text, footer])


def _respace(rng: random.Random, text: str) -> str:
    """Drop some spaces between eojeol, double others and split a few words: Korean spacing
    varies a lot in the wild, and a leak must still be recognised through it."""

    def respace_line(line: str) -> str:
        words = line.split(" ")
        out = [words[0]]
        for word in words[1:]:
            if len(word) >= 4 and rng.random() < 0.1:
                cut = rng.randint(1, len(word) - 1)
                word = f"{word[:cut]} {word[cut:]}"
            roll = rng.random()
            out.append(("" if roll < 0.3 else "  " if roll < 0.4 else " ") + word)
        return "".join(out)

    changed = "\n".join(respace_line(line) for line in text.split("\n"))
    return changed if changed != text else text.replace(" ", "", 1)


def _repunctuate(rng: random.Random, text: str) -> str:
    """Remove or change punctuation marks, leaving the words themselves alone."""
    out = []
    for char in text:
        swaps = _PUNCTUATION_SWAPS.get(char)
        out.append(rng.choice(swaps) if swaps and rng.random() < 0.7 else char)
    changed = "".join(out)
    return changed if changed != text else text.replace(".", "", 1)


def _embed(rng: random.Random, atlas: Atlas, text: str) -> str:
    """The item inside a longer, unrelated document: more of it before the item than twice the
    item's length, and more than that length after (its mirrors differ in all of that)."""
    hosts = (encyclopedia_entry, diary, essay)

    def host_text(at_least: int) -> list[str]:
        parts: list[str] = []
        while sum(map(len, parts)) <= at_least:
            parts.append(rng.choice(hosts)(rng, atlas))
        return parts

    return "\n\n".join([*host_text(2 * len(text)), text, *host_text(len(text))])


def planted_text(rng: random.Random, atlas: Atlas, item: dict, site: int) -> str:
    """One copy of the benchmark item's text as planted in its style, on `site` (the embedded
    style's host document is the site's page)."""
    text = item_text(item)
    style = item["plant_style"]
    if style == "verbatim":
        return _on_site(rng, site, text)
    if style == "spacing":
        return _on_site(rng, site, _respace(rng, text))
    if style == "punctuation":
        return _on_site(rng, site, _repunctuate(rng, text))
    if style == "embedded":
        return _embed(rng, atlas, text)
    raise ValueError(f"unknown plant style {style!r}")
