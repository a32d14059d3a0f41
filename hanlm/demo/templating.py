"""The demo world's Hangul templates: reading the data files in `templates/`, and filling them.

A template is text with slots: `{name}` is replaced by a value, `{name:은/는}` by the value followed
by the right particle (see `hanlm.korean.josa`).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from hanlm.korean import josa

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# The files in templates/, by name without the .toml suffix.
FILES = (
    "facts",
    "names",
    "encyclopedia",
    "exercises",
    "word_problems",
    "everyday",
    "benchmark",
    "chat",
)

_SLOT = re.compile(r"\{(\w+)(?::([^{}]+))?\}")


@functools.cache
def load(name: str) -> dict:
    """The parsed `templates/<name>.toml`, shipped inside the package (so a wheel has it too)."""
    if name not in FILES:
        raise ValueError(f"unknown template file {name!r}; one of {FILES}")
    text = resources.files(__package__).joinpath("templates", f"{name}.toml").read_text("utf-8")
    return tomllib.loads(text)


def slots(template: str) -> list[tuple[str, str | None]]:
    """The (name, particle pair or None) of each slot in `template`, in order."""
    return [(m.group(1), m.group(2)) for m in _SLOT.finditer(template)]


def fill(template: str, **values: object) -> str:
    """Fill `{name}` and `{name:은/는}` slots; the second form attaches the right particle."""

    def replace(match: re.Match) -> str:
        word = str(values[match.group(1)])
        pair = match.group(2)
        return josa(word, pair) if pair else word

    return _SLOT.sub(replace, template)


def fill_all(templates: list[str] | tuple[str, ...], **values: object) -> str:
    """The filled templates as one text, separated by spaces."""
    return " ".join(fill(t, **values) for t in templates)
