"""Reading exercises: a paragraph about a country, then questions, each with its answer
(templates/exercises.toml).

Real pretraining text holds such exercises (workbooks, quiz sites). The demo's benchmark asks the
same facts about passages of its own and answers in the same sentences, so its clean items can be
answered from what the corpus teaches without being in it.
"""

from __future__ import annotations

import random

from hanlm.demo.encyclopedia import PLAIN, POLITE
from hanlm.demo.encyclopedia import _country_slots as country_slots  # the entries' own slots
from hanlm.demo.facts import Atlas
from hanlm.demo.templating import fill, fill_all, load

_TEXT = load("exercises")
_KINDS = ("capital", "continent")


def _passage(rng: random.Random, slots: dict[str, str]) -> str:
    """The intro (it names the continent), the capital sentence and a few others, shuffled."""
    register = PLAIN if rng.random() < 0.75 else POLITE
    body = [rng.choice(register.capital)]
    body += rng.sample(register.continent, k=rng.randint(0, 1))
    body += rng.sample(register.filler, k=rng.randint(1, 3))
    rng.shuffle(body)
    return fill_all([rng.choice(register.intro), *body], **slots)


def reading_exercise(rng: random.Random, atlas: Atlas) -> str:
    fact = rng.choice(atlas.facts)
    slots = country_slots(rng, atlas, fact)
    passage = _passage(rng, slots)
    lines = []
    for kind in rng.sample(_KINDS, k=rng.randint(1, 2)):
        lines.append(fill(rng.choice(_TEXT["questions"][kind]), **slots))
        lines.append(fill(_TEXT["answers"][kind], **slots))
    title = rng.choice(_TEXT["titles"])
    return "\n".join(([title] if title else []) + [passage, *lines])
