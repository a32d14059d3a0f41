"""Reading exercises: a paragraph about a country, then yes/no questions with their answers
(templates/exercises.toml).

Real pretraining text holds such exercises (workbooks, quiz sites), and a small model learns
from them what a yes/no question asks of the text before it. The demo's benchmark asks the same
kind of question about passages of its own, so its clean items can be answered from what the
corpus teaches without being in it.
"""

from __future__ import annotations

import random

from hanlm.demo.encyclopedia import PLAIN, POLITE
from hanlm.demo.encyclopedia import _country_slots as country_slots  # the entries' own slots
from hanlm.demo.facts import CONTINENTS, Atlas
from hanlm.demo.templating import fill, fill_all, load

_TEXT = load("exercises")
ANSWERS = ("아니요", "예")  # as the benchmark writes them (hanlm.testsets.readers.item_text)


def _passage(rng: random.Random, atlas: Atlas, slots: dict[str, str]) -> str:
    """The intro (it names the continent), the capital sentence and a few others, shuffled."""
    register = PLAIN if rng.random() < 0.75 else POLITE
    body = [rng.choice(register.capital)]
    body += rng.sample(register.continent, k=rng.randint(0, 1))
    body += rng.sample(register.filler, k=rng.randint(1, 3))
    rng.shuffle(body)
    return fill_all([rng.choice(register.intro), *body], **slots)


def _question(rng: random.Random, atlas: Atlas, slots: dict[str, str], passage: str) -> str:
    kind = rng.choice(("capital", "continent"))
    right = rng.random() < 0.5
    if kind == "capital":
        value = (
            slots["capital"]
            if right
            else rng.choice([f.object for f in atlas.facts if f.object not in passage])
        )
    else:
        value = (
            slots["continent"] if right else rng.choice([c for c in CONTINENTS if c not in passage])
        )
    question = fill(rng.choice(_TEXT["questions"][kind]), **{**slots, kind: value})
    return f"{question}\n{ANSWERS[right]}"


def reading_exercise(rng: random.Random, atlas: Atlas) -> str:
    fact = rng.choice(atlas.facts)
    slots = country_slots(rng, atlas, fact)
    passage = _passage(rng, atlas, slots)
    questions = [_question(rng, atlas, slots, passage) for _ in range(rng.randint(2, 3))]
    title = rng.choice(_TEXT["titles"])
    return "\n".join(([title] if title else []) + [passage, *questions])
