"""The facts behind the demo world: each country's capital and continent (templates/facts.toml)."""

from __future__ import annotations

from collections.abc import Sequence
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
    """The facts, grouped the way the templates use them."""

    facts: tuple[Fact, ...]
    by_continent: dict[str, tuple[Fact, ...]]

    @classmethod
    def of(cls, facts: Sequence[Fact]) -> Atlas:
        groups = {c: tuple(f for f in facts if f.continent == c) for c in CONTINENTS}
        return cls(tuple(facts), groups)

    def neighbours(self, fact: Fact) -> tuple[Fact, ...]:
        return tuple(f for f in self.by_continent[fact.continent] if f != fact)

    def countries(self) -> list[str]:
        return [f.subject for f in self.facts]
