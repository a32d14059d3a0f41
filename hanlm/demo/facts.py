"""The facts behind the demo world: each country's capital and continent (templates/facts.toml)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hanlm.demo import templating


@dataclass(frozen=True)
class Fact:
    """One row of the facts table, e.g. Fact("프랑스", "capital", "파리", "유럽")."""

    subject: str
    relation: str
    object: str
    continent: str


_TABLE = templating.load("facts")
CONTINENTS: tuple[str, ...] = tuple(_TABLE["continents"])
FACTS: tuple[Fact, ...] = tuple(
    Fact(country, "capital", capital, continent)
    for country, capital, continent in _TABLE["capitals"]
)


@dataclass(frozen=True)
class Atlas:
    """The facts, grouped the way the templates use them; `reverse_stated` holds the subjects
    whose facts the documents also state object first ("B는 A의 수도이다")."""

    facts: tuple[Fact, ...]
    by_continent: dict[str, tuple[Fact, ...]]
    reverse_stated: frozenset[str] = frozenset()

    @classmethod
    def of(cls, facts: Sequence[Fact], reverse_stated: Iterable[str] = ()) -> Atlas:
        groups = {c: tuple(f for f in facts if f.continent == c) for c in CONTINENTS}
        return cls(tuple(facts), groups, frozenset(reverse_stated))

    def neighbours(self, fact: Fact) -> tuple[Fact, ...]:
        return tuple(f for f in self.by_continent[fact.continent] if f != fact)

    def countries(self) -> list[str]:
        return [f.subject for f in self.facts]


def pick_reverse_stated(rng: random.Random, facts: Sequence[Fact], share: float) -> set[str]:
    """The subjects of a seeded `share` of the facts (rounded to whole facts): the facts whose
    reverse direction the world writes, the rest held out for the direction probe's comparison."""
    if not 0 <= share <= 1:
        raise ValueError(f"reverse share must be between 0 and 1, got {share}")
    count = round(share * len(facts))
    return {f.subject for f in rng.sample(list(facts), count)}
