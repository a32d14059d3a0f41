"""Encyclopedia documents about the countries of the facts table (templates/encyclopedia.toml)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hanlm.demo.facts import CONTINENTS, Atlas, Fact
from hanlm.demo.templating import fill, fill_all, load

_TEXT = load("encyclopedia")


@dataclass(frozen=True)
class Register:
    """Sentence templates of one writing register, by role in a paragraph about a country."""

    intro: list[str]
    capital: list[str]
    reverse_capital: list[str]  # object first: only for the facts in Atlas.reverse_stated
    continent: list[str]
    filler: list[str]


PLAIN = Register(**_TEXT["register"]["plain"])
POLITE = Register(**_TEXT["register"]["polite"])


def _country_slots(rng: random.Random, atlas: Atlas, fact: Fact) -> dict[str, str]:
    neighbours = atlas.neighbours(fact)

    def some_neighbours() -> str:
        picked = rng.sample(neighbours, k=min(len(neighbours), rng.randint(2, 4)))
        return ", ".join(f.subject for f in picked)

    other = rng.choice(neighbours)
    return {
        "country": fact.subject,
        "capital": fact.object,
        "continent": fact.continent,
        "others": some_neighbours(),
        "more_others": some_neighbours(),
        "other": other.subject,
        "other_capital": other.object,
    }


def _country_paragraph(
    rng: random.Random,
    register: Register,
    slots: dict[str, str],
    *,
    with_capital: bool = True,
    reverse: bool = False,
) -> str:
    """One paragraph in shuffled order, so a small model cannot learn a single fixed template.
    With `reverse`, a paragraph stating the capital also states it object first."""
    body = [rng.choice(register.capital)] if with_capital else []
    if with_capital and reverse:  # no draw otherwise: a world without reverse facts is unchanged
        body.append(rng.choice(register.reverse_capital))
    body += rng.sample(register.continent, k=rng.randint(0, 2))
    body += rng.sample(register.filler, k=rng.randint(2, 3))
    rng.shuffle(body)
    if rng.random() < 0.8:
        body.insert(0, rng.choice(register.intro))
    return fill_all(body, **slots)


def encyclopedia_entry(rng: random.Random, atlas: Atlas) -> str:
    fact = rng.choice(atlas.facts)
    slots = _country_slots(rng, atlas, fact)
    register = PLAIN if rng.random() < 0.75 else POLITE
    reverse = fact.subject in atlas.reverse_stated
    paragraphs = [_country_paragraph(rng, register, slots, reverse=reverse)]
    if rng.random() < 0.35:
        with_capital = rng.random() < 0.5
        paragraphs.append(
            _country_paragraph(rng, register, slots, with_capital=with_capital, reverse=reverse)
        )
    title = rng.choice(_TEXT["entry_titles"])
    if title:
        paragraphs.insert(0, fill(title, **slots))
    return "\n\n".join(paragraphs) if rng.random() < 0.5 else "\n".join(paragraphs)


def capital_list(rng: random.Random, atlas: Atlas) -> str:
    title = rng.choice(_TEXT["list_titles"])
    continent = rng.choice(CONTINENTS)
    pool = atlas.by_continent[continent] if "{continent}" in title else atlas.facts
    chosen = rng.sample(pool, k=min(len(pool), rng.randint(6, 15)))
    line = rng.choice(_TEXT["list_lines"])
    numbered = rng.random() < 0.5
    lines = [fill(title, continent=continent)]
    for number, fact in enumerate(chosen, start=1):
        bullet = f"{number}. " if numbered else "- "
        lines.append(bullet + fill(line, country=fact.subject, capital=fact.object))
    return "\n".join(lines)


def capital_comparison(rng: random.Random, atlas: Atlas) -> str:
    first, second = rng.sample(atlas.facts, k=2)
    slots = {
        "a": first.subject,
        "a_capital": first.object,
        "a_continent": first.continent,
        "b": second.subject,
        "b_capital": second.object,
        "b_continent": second.continent,
    }
    text = _TEXT["comparison"]
    continents = (
        text["same_continent"]
        if first.continent == second.continent
        else rng.choice(text["different_continents"])
    )
    return fill_all([text["capitals"], continents, rng.choice(text["closings"])], **slots)


def continent_overview(rng: random.Random, atlas: Atlas) -> str:
    """A long document: several paragraphs, one per country of a continent."""
    continent = rng.choice(CONTINENTS)
    members = list(atlas.by_continent[continent])
    chosen = rng.sample(members, k=min(len(members), rng.randint(5, 10)))
    text = _TEXT["overview"]
    paragraphs = [
        fill(text["title"], continent=continent),
        fill(text["opening"], continent=continent),
    ]
    for fact in chosen:
        slots = _country_slots(rng, atlas, fact)
        reverse = fact.subject in atlas.reverse_stated
        paragraphs.append(_country_paragraph(rng, PLAIN, slots, reverse=reverse))
    return "\n\n".join(paragraphs)
