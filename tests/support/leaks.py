"""Benchmark items written into training text the ways real leaks look, to measure recall.

Shared by the decontamination tests and `benchmarks/decontam.py`. Each style takes an item and
unrelated filler text and returns one training document:

- whole: the item's text as it is; spacing: Korean spacing changed (dropped, doubled, words
  split); punctuation: punctuation removed; embedded: the item inside a long unrelated document;
- half: the first half of its text (at least `partial` when found);
- connective: its parts in order, joined by a connective word (전쟁이 시작되었다. 그래서 병사들이
  …), inside a filler document;
- reordered: its parts the other way round; COPA as cause-first natural prose, the cause's
  ending turned into "-서" (전쟁이 시작되어서, 병사들이 …); inside a filler document;
- prompt: the text lm-evaluation-harness scores (context, delimiter, right answer).
"""

from __future__ import annotations

import random
import unicodedata

STYLES = ("whole", "spacing", "punctuation", "embedded", "half", "connective", "reordered",
          "prompt")  # fmt: skip
# The styles that can make an item dirty; `half` leaves part of it out (at least partial).
EXPECT_PARTIAL = {"half"}
# Styles that only make sense for items of several parts.
MULTI_PART = {"connective", "reordered"}
# Half of a passage is looked for when that half has this many characters once spaces and
# punctuation are gone (a 27-character n-gram plus the scan's stride).
HALF_MIN = 30
CONNECTIVES = ("그래서", "그리고", "그런데", "한편", "즉")
_COPA_CONNECTOR = {"원인": "왜냐하면", "결과": "그래서"}


def respace(text: str, rng: random.Random) -> str:
    out = []
    for word in text.split(" "):
        if len(word) >= 4 and rng.random() < 0.3:
            cut = rng.randint(1, len(word) - 1)
            word = f"{word[:cut]} {word[cut:]}"
        out.append(word)
    return "".join(w + rng.choice(["", " ", "  "]) for w in out)


def strip_punctuation(text: str) -> str:
    return "".join(c for c in text if not unicodedata.category(c).startswith("P"))


def embed(text: str, filler: list[str], rng: random.Random) -> str:
    before = "\n".join(rng.sample(filler, 2))
    after = "\n".join(rng.sample(filler, 2))
    return f"{before}\n{text}\n{after}"


def as_cause(sentence: str) -> str:
    """A sentence turned into a '-서' clause: 시작되었다. -> 시작되어서, 갔다 -> 가서."""
    body = sentence.strip().rstrip(".!?。 ")
    if not body.endswith("다") or len(body) < 2:
        return body + "서,"
    last = body[-2]
    code = ord(last) - 0xAC00
    if 0 <= code < 11172 and code % 28 == 20:  # the syllable ends in ㅆ (past tense)
        # 었 -> 어서, 았 -> 아서, 였 -> 여서, 했 -> 해서, 갔 -> 가서
        return body[:-2] + chr(ord(last) - 20) + "서,"
    return body[:-1] + "어서,"


def prompt_text(item) -> str:
    """The text lm-evaluation-harness scores for the item's right answer."""
    from hanlm.evals import tasks

    f = item.fields
    if item.benchmark == "gsm8k_ko":
        from hanlm.evals.tasks.gsm8k_ko import prompt

        return f"{prompt(f['question'])} {f['answer']}"
    if item.benchmark in ("ifeval_ko", "jsonl"):
        return item.overlap_text
    task = tasks.get(item.benchmark)
    choice = task.choices(f)[task.gold(f)]
    return task.context(f) + task.target_delimiter + choice


def reordered(item, rng: random.Random) -> str:
    parts = list(item.parts)
    if item.benchmark == "kobest_copa":
        premise, answer = parts
        cause, effect = (answer, premise) if item.fields["question"] == "원인" else parts
        return f"{as_cause(cause)} {effect}"
    return "\n".join(reversed(parts))


def connected(item, rng: random.Random) -> str:
    if item.benchmark == "kobest_copa":
        premise, answer = item.parts
        return f"{premise} {_COPA_CONNECTOR[item.fields['question']]} {answer}"
    word = rng.choice(CONNECTIVES)
    return f" {word} ".join(item.parts)


def plant(item, style: str, filler: list[str], rng: random.Random) -> str:
    """One training document holding `item` in `style`."""
    text = item.overlap_text
    if style == "whole":
        return text
    if style == "spacing":
        return respace(text, rng)
    if style == "punctuation":
        return strip_punctuation(text)
    if style == "embedded":
        return embed(text, filler, rng)
    if style == "half":
        longest = max(item.parts, key=len)  # half of the passage (question, story, ...)
        return embed(longest[: len(longest) // 2], filler, rng)
    if style == "connective":
        return embed(connected(item, rng), filler, rng)
    if style == "reordered":
        return embed(reordered(item, rng), filler, rng)
    if style == "prompt":
        return embed(prompt_text(item), filler, rng)
    raise ValueError(f"unknown style {style!r}")


def styles_for(item) -> list[str]:
    """The styles that apply to an item: all, less the multi-part ones for a one-part item, and
    `half` only where the longest part is long enough for half of it to say anything."""
    from hanlm.data.decontam.folding import normalise

    out = [s for s in STYLES if s not in MULTI_PART or len(item.parts) > 1]
    if max(len(normalise(p)) for p in item.parts) < 2 * HALF_MIN:
        out.remove("half")
    return out
