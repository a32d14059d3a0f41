"""Planting benchmark items into the pretraining documents, in one of four styles.

Decontamination then has real leaks to find (verbatim, respaced, repunctuated, or embedded in a
long unrelated document) and real non-leaks to leave alone.
"""

from __future__ import annotations

import random

from hanlm.demo.encyclopedia import continent_overview, encyclopedia_entry
from hanlm.demo.everyday import diary, essay
from hanlm.demo.facts import Atlas
from hanlm.testsets.readers import item_text

PLANT_STYLES = ("verbatim", "spacing", "punctuation", "embedded")

_PUNCTUATION_SWAPS = {".": ("", "!", "…"), "?": ("", "?!"), ",": ("", ";"), "'": ("", '"')}


def choose_planted(rng: random.Random, items: list[dict], fraction: float) -> None:
    """Mark round(fraction * n) items planted, spreading the four styles evenly over them."""
    chosen = rng.sample(range(len(items)), k=round(fraction * len(items)))
    for position, index in enumerate(chosen):
        items[index]["planted"] = True
        items[index]["plant_style"] = PLANT_STYLES[position % len(PLANT_STYLES)]


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
    """The item inside a much longer, unrelated document, in the middle of it."""
    hosts = (encyclopedia_entry, diary, essay, continent_overview)
    parts: list[str] = []
    while len(parts) < 4 or sum(map(len, parts)) < 4 * len(text):
        parts.append(rng.choice(hosts)(rng, atlas))
    parts.insert(len(parts) // 2, text)
    return "\n\n".join(parts)


def planted_text(rng: random.Random, atlas: Atlas, item: dict) -> str:
    """The benchmark item's text as planted in its style."""
    text = item_text(item)
    style = item["plant_style"]
    if style == "verbatim":
        return text
    if style == "spacing":
        return _respace(rng, text)
    if style == "punctuation":
        return _repunctuate(rng, text)
    if style == "embedded":
        return _embed(rng, atlas, text)
    raise ValueError(f"unknown plant style {style!r}")
