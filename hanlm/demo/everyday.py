"""Everyday writing: diaries, short essays, letters and recipes (templates/everyday.toml)."""

from __future__ import annotations

import random

from hanlm.demo.facts import Atlas
from hanlm.demo.templating import fill, fill_all, load

_TEXT = load("everyday")
_NAMES = load("names")["names"]


def _date(rng: random.Random) -> dict[str, int]:
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    return {"month": month, "day": day}


def diary(rng: random.Random, atlas: Atlas) -> str:
    text = _TEXT["diary"]
    date = _date(rng)
    slots = {"friend": rng.choice(_NAMES), "food": rng.choice(_TEXT["foods"])}
    sentences = [rng.choice(text["weather"])]
    sentences += rng.sample(text["activities"], k=rng.randint(2, 4))
    sentences.append(rng.choice(text["closings"]))
    title = fill(rng.choice(text["titles"]), **date)
    body = fill_all(sentences, **slots)
    return f"{title}\n{body}" if title else body


def essay(rng: random.Random, atlas: Atlas) -> str:
    topic = rng.choice(list(_TEXT["essays"]))
    opening, *rest = _TEXT["essays"][topic]
    body = [opening, *rng.sample(rest, k=rng.randint(3, len(rest)))]
    return f"{topic}\n" + " ".join(body)


def letter(rng: random.Random, atlas: Atlas) -> str:
    text = _TEXT["letter"]
    to, sender = rng.sample(_NAMES, k=2)
    date = _date(rng)
    body = [rng.choice(text["openings"]), *rng.sample(text["bodies"], k=rng.randint(2, 4))]
    body.append(rng.choice(text["closings"]))
    lines = [
        fill(text["heading"], to=to),
        fill_all(body, food=rng.choice(_TEXT["foods"])),
        fill(text["signature"], sender=sender, **date),
    ]
    return "\n".join(lines)


def recipe(rng: random.Random, atlas: Atlas) -> str:
    text = _TEXT["recipe"]
    dish = rng.choice(list(text["steps"]))
    intro = fill(rng.choice(text["intros"]), name=rng.choice(_NAMES), dish=dish)
    steps = [f"{n}. {step}" for n, step in enumerate(text["steps"][dish], start=1)]
    return "\n".join([fill(text["title"], dish=dish), intro, *steps, rng.choice(text["tips"])])
