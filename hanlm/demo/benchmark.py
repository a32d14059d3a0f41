"""The demo benchmark: passages of their own about the world's countries, each with a question
about a fact the corpus states and two answers to choose from (templates/benchmark.toml).

Every scenario has the same shape, so one class makes them all from the file's descriptions: draw
the values, write the passage, offer the questions with their right and wrong answers.
"""

from __future__ import annotations

import ast
import random
import unicodedata
from dataclasses import dataclass

from hanlm.demo import draws
from hanlm.demo.facts import CONTINENTS, Atlas
from hanlm.demo.templating import fill, fill_all, load

_TEXT = load("benchmark")
# What a scenario's values may read besides their own (and the atlas's facts, see `make`).
_NAMES = {"names": load("names")["names"], **_TEXT["words"]}

# Benchmark items are kept well below the corpus stage's near-duplicate threshold (Jaccard 0.85
# over character 5-grams) from one another: two planted items that differ in a name or two
# would otherwise be thrown out together, and the planted record would lie.
_MAX_ITEM_SIMILARITY = 0.6
_MAX_TRIES = 1000
# Nor may two items share a span as long as decontamination's n-gram (decontam.ngram's default):
# items of one scenario about one country would, and planting one would make the other partial.
_SHARED_SPAN = 27


@dataclass(frozen=True)
class _Part:
    """A part of a passage: a sentence, or one picked from several; written only if `when`."""

    texts: tuple[str, ...]
    pick: bool  # a list in the file: pick one of `texts`
    when: ast.expr | None = None  # an expression over the values

    @classmethod
    def of(cls, entry: str | list | dict) -> _Part:
        if isinstance(entry, dict):
            text = cls.of(entry["text"])
            return cls(text.texts, text.pick, draws.parse_expression(entry["when"]))
        return cls((entry,), False) if isinstance(entry, str) else cls(tuple(entry), True)

    def write(self, rng: random.Random, values: dict) -> str | None:
        if self.when is not None and not draws.evaluate(rng, self.when, values):
            return None
        return rng.choice(self.texts) if self.pick else self.texts[0]


@dataclass(frozen=True)
class WrittenQuestion:
    """A question written for one passage: what it asks, the question, its right and wrong answer."""

    asks: str
    question: str
    right: str
    wrong: str


@dataclass(frozen=True)
class Question:
    """A question with its right and wrong answer, over a scenario's values; `asks` names the
    kind of fact it asks (an item's `asks`)."""

    asks: str
    question: str
    right: str
    wrong: str

    def write(self, values: dict) -> WrittenQuestion:
        return WrittenQuestion(
            self.asks,
            fill(self.question, **values),
            fill(self.right, **values),
            fill(self.wrong, **values),
        )


_FACT_VALUES = draws.parse_assignments(_TEXT["facts"])
QUESTIONS: tuple[Question, ...] = tuple(Question(*entry) for entry in _TEXT["questions"])


@dataclass(frozen=True)
class Scenario:
    """One [[scenario]] of the file, parsed once."""

    id: str
    values: tuple[draws.Assignment, ...]
    passage: tuple[_Part, ...]

    @classmethod
    def of(cls, entry: dict) -> Scenario:
        values = _FACT_VALUES + tuple(draws.parse_assignments(entry["values"]))
        return cls(entry["id"], values, tuple(_Part.of(part) for part in entry["passage"]))

    def make(self, rng: random.Random, atlas: Atlas) -> tuple[str, list[WrittenQuestion]]:
        """A passage and every question it may be asked, with their right and wrong answers."""
        values = draws.draw(rng, self.values, _NAMES | _facts(atlas))
        parts = [part.write(rng, values) for part in self.passage]
        passage = fill_all([p for p in parts if p is not None], **values)
        return passage, [question.write(values) for question in QUESTIONS]


def _facts(atlas: Atlas) -> dict[str, object]:
    return {
        "countries": atlas.countries(),
        "continents": list(CONTINENTS),
        "capitals": {f.subject: f.object for f in atlas.facts},
        "continent_of": {f.subject: f.continent for f in atlas.facts},
    }


SCENARIOS: tuple[Scenario, ...] = tuple(Scenario.of(entry) for entry in _TEXT["scenario"])


def _compact(text: str) -> str:
    """Text without whitespace or punctuation: what survives the spacing and punctuation styles."""
    return "".join(
        c for c in text if not c.isspace() and not unicodedata.category(c).startswith("P")
    )


def _shingles(text: str, size: int = 5) -> frozenset[str]:
    compacted = _compact(text)
    return frozenset(compacted[i : i + size] for i in range(max(1, len(compacted) - size + 1)))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def _spans(text: str, size: int = _SHARED_SPAN) -> set[str]:
    compacted = _compact(text)
    return {compacted[i : i + size] for i in range(max(1, len(compacted) - size + 1))}


def make_benchmark(rng: random.Random, atlas: Atlas, count: int) -> list[dict]:
    """`count` items, each a passage, a question and two choices; the right one is first in half
    of them (`answer` is its index), so always picking one position scores exactly chance.
    `asks` is the kind of fact the question asks (benchmark.toml's `questions`)."""
    golds = [i % 2 for i in range(count)]
    rng.shuffle(golds)
    taken: list[tuple[str, frozenset[str]]] = []
    spans: set[str] = set()
    items = []
    for index, gold in enumerate(golds):
        passage, asked = _distinct_item(rng, atlas, taken, spans)
        right, wrong = asked.right, asked.wrong
        items.append(
            {
                "item_id": f"demo-qa-{index:04d}",
                "passage": passage,
                "question": asked.question,
                "choices": [wrong, right] if gold else [right, wrong],
                "answer": gold,
                "asks": asked.asks,
                "planted": False,
                "plant_style": None,
            }
        )
    return items


def _distinct_item(
    rng: random.Random,
    atlas: Atlas,
    taken: list[tuple[str, frozenset[str]]],
    spans: set[str],
) -> tuple[str, WrittenQuestion]:
    """A passage and its question, unlike every item in `taken` and whose passage shares none of
    `spans` (then both added).

    A passage inside another one would leak an unplanted item whenever the other is planted. The
    questions and answers are the same for every passage about a country, and decontamination
    counts such shared text only for items of the same passage (`_not_boilerplate`).
    """
    for _ in range(_MAX_TRIES):
        passage, questions = rng.choice(SCENARIOS).make(rng, atlas)
        question = rng.choice(questions)
        key, shingles = _compact(passage), _shingles(f"{passage}\n{question.question}")
        own_spans = _spans(passage)
        if own_spans.isdisjoint(spans) and not any(
            key in old_key or old_key in key or _jaccard(shingles, old) > _MAX_ITEM_SIMILARITY
            for old_key, old in taken
        ):
            taken.append((key, shingles))
            spans |= own_spans
            return passage, question
    raise ValueError(f"cannot make {len(taken) + 1} distinct benchmark items; ask for fewer")
