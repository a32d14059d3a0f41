"""Chat conversations for SFT, kept out of the pretraining documents (templates/chat.toml)."""

from __future__ import annotations

import random

from hanlm.demo.facts import Atlas
from hanlm.demo.templating import fill, load
from hanlm.demo.word_problems import word_problem

_TEXT = load("chat")
# kind -> (questions, answers) about one fact; a follow-up is answered like a capital question.
_FACT_EXCHANGES = {
    "capital": (_TEXT["capital_questions"], _TEXT["capital_answers"]),
    "follow_up": (_TEXT["follow_up_questions"], _TEXT["capital_answers"][:2]),
    "continent": (_TEXT["continent_questions"], _TEXT["continent_answers"]),
}
# kind -> fixed [user, assistant] pairs
_FIXED_EXCHANGES = {
    "greeting": _TEXT["greetings"],
    "small_talk": _TEXT["small_talk"],
    "thanks": _TEXT["thanks"],
}


def _turn_kind(rng: random.Random, index: int, turns: int, previous: str | None) -> str:
    """What the user asks next: greetings only open, thanks only close, follow-ups follow."""
    weights = {"capital": 4, "continent": 2, "math": 3, "small_talk": 1}
    if index == 0:
        weights["greeting"] = 2
    if index == turns - 1 and index > 0:
        weights["thanks"] = 3
    if previous in ("capital", "follow_up"):
        weights["follow_up"] = 3
    kinds = list(weights)
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


def _exchange(rng: random.Random, atlas: Atlas, kind: str) -> tuple[str, str]:
    """One user message and the assistant's reply."""
    if kind in _FACT_EXCHANGES:
        fact = rng.choice(atlas.facts)
        slots = {"country": fact.subject, "capital": fact.object, "continent": fact.continent}
        questions, answers = _FACT_EXCHANGES[kind]
        return fill(rng.choice(questions), **slots), fill(rng.choice(answers), **slots)
    if kind == "math":
        problem = word_problem(rng)
        request = fill(rng.choice(_TEXT["math_requests"]), question=problem.question)
        return request, problem.solution()
    user, assistant = rng.choice(_FIXED_EXCHANGES[kind])
    return user, assistant


def conversation(rng: random.Random, atlas: Atlas) -> list[dict]:
    """A conversation of one to three exchanges, sometimes opened by a system prompt."""
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(_TEXT["system_prompts"])})
    turns = rng.choices((1, 2, 3), weights=(45, 35, 20))[0]
    previous = None
    for index in range(turns):
        kind = _turn_kind(rng, index, turns, previous)
        user, assistant = _exchange(rng, atlas, kind)
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
        previous = kind
    return messages
