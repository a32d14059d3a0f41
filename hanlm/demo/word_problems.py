"""Arithmetic word problems with worked answers (templates/word_problems.toml).

Every problem has the same shape, so one function makes them all from the file's descriptions:
draw the values, fill the question and the steps, close with the answer as `#### N`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hanlm.demo import draws
from hanlm.demo.facts import Atlas
from hanlm.demo.templating import fill, load

_TEXT = load("word_problems")
# What a problem's values may read besides their own.
_NAMES = {"names": load("names")["names"], **_TEXT["words"]}


@dataclass(frozen=True)
class Problem:
    """A word problem; every step shows its arithmetic as `a op b = c` so it can be checked."""

    question: str
    steps: tuple[str, ...]
    answer: int

    def solution(self) -> str:
        return "\n".join(self.steps) + f"\n#### {self.answer}"


@dataclass(frozen=True)
class ProblemKind:
    """One [[problem]] of the file, its values parsed once."""

    id: str
    values: tuple[draws.Assignment, ...]
    question: str | list[str]  # a list: one is picked after the values
    steps: list[str]
    answer: str

    @classmethod
    def of(cls, entry: dict) -> ProblemKind:
        values = draws.parse_assignments(entry["values"])
        return cls(entry["id"], values, entry["question"], entry["steps"], entry["answer"])

    def make(self, rng: random.Random) -> Problem:
        values = draws.draw(rng, self.values, _NAMES)
        question = self.question if isinstance(self.question, str) else rng.choice(self.question)
        steps = tuple(fill(step, **values) for step in self.steps)
        return Problem(fill(question, **values), steps, values[self.answer])


KINDS: tuple[ProblemKind, ...] = tuple(ProblemKind.of(entry) for entry in _TEXT["problem"])


def word_problem(rng: random.Random) -> Problem:
    return rng.choice(KINDS).make(rng)


def math_document(rng: random.Random, atlas: Atlas) -> str:
    problem = word_problem(rng)
    layout = rng.choice(_TEXT["layouts"])
    return fill(layout, question=problem.question, solution=problem.solution())


def math_collection(rng: random.Random, atlas: Atlas) -> str:
    """A long document: several problems, each closed by its own `#### N` line."""
    blocks = [rng.choice(_TEXT["collection_titles"])]
    for number in range(1, rng.randint(4, 8) + 1):
        problem = word_problem(rng)
        blocks.append(
            fill(
                _TEXT["collection_item"],
                number=number,
                question=problem.question,
                solution=problem.solution(),
            )
        )
    return "\n\n".join(blocks)
