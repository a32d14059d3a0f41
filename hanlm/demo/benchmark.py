"""The yes/no benchmark: passages of their own about the world's countries, with questions
about the facts the corpus states (templates/benchmark.toml).

Every scenario has the same shape, so one class makes them all from the file's descriptions: draw
the values, write the passage, offer the candidate questions with their answers.
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
class Scenario:
    """One [[scenario]] of the file, parsed once."""

    id: str
    values: tuple[draws.Assignment, ...]
    passage: tuple[_Part, ...]
    candidates: tuple[tuple[str, bool | ast.expr], ...]

    @classmethod
    def of(cls, entry: dict) -> Scenario:
        values = draws.parse_assignments(entry["values"])
        parts = tuple(_Part.of(part) for part in entry["passage"])
        candidates = tuple(
            (question, answer if isinstance(answer, bool) else draws.parse_expression(answer))
            for question, answer in entry["candidates"]
        )
        return cls(entry["id"], values, parts, candidates)

    def make(self, rng: random.Random, atlas: Atlas) -> tuple[str, list[tuple[str, bool]]]:
        """A passage and its candidate (question, answer) pairs."""
        values = draws.draw(rng, self.values, _NAMES | _facts(atlas))
        parts = [part.write(rng, values) for part in self.passage]
        passage = fill_all([p for p in parts if p is not None], **values)
        return passage, [
            (fill(question, **values), self._answer(rng, answer, values))
            for question, answer in self.candidates
        ]

    @staticmethod
    def _answer(rng: random.Random, answer: bool | ast.expr, values: dict) -> bool:
        return answer if isinstance(answer, bool) else bool(draws.evaluate(rng, answer, values))


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
    answers = [i % 2 == 0 for i in range(count)]  # balanced: as many "예" as "아니요"
    rng.shuffle(answers)
    taken: list[tuple[str, frozenset[str]]] = []
    spans: set[str] = set()
    items = []
    for index, answer in enumerate(answers):
        passage, question = _distinct_item(rng, atlas, answer, taken, spans)
        items.append(
            {
                "item_id": f"demo-qa-{index:04d}",
                "passage": passage,
                "question": question,
                "answer": answer,
                "planted": False,
                "plant_style": None,
            }
        )
    return items


def _distinct_item(
    rng: random.Random,
    atlas: Atlas,
    answer: bool,
    taken: list[tuple[str, frozenset[str]]],
    spans: set[str],
) -> tuple[str, str]:
    """A passage and question with the given answer, unlike every item in `taken` and sharing
    none of `spans` (then both added).

    A passage inside another one would leak an unplanted item whenever the other is planted.
    """
    for _ in range(_MAX_TRIES):
        passage, candidates = rng.choice(SCENARIOS).make(rng, atlas)
        question = rng.choice([q for q, a in candidates if a == answer])
        key, shingles = _compact(passage), _shingles(f"{passage}\n{question}")
        own_spans = _spans(f"{passage}\n{question}")
        if own_spans.isdisjoint(spans) and not any(
            key in old_key or old_key in key or _jaccard(shingles, old) > _MAX_ITEM_SIMILARITY
            for old_key, old in taken
        ):
            taken.append((key, shingles))
            spans |= own_spans
            return passage, question
    raise ValueError(f"cannot make {len(taken) + 1} distinct benchmark items; ask for fewer")
