"""Small markdown pieces the report card's sections share: tables, numbers, headings, a missing stage."""

from __future__ import annotations

import math
from typing import Any

GIB = 1 << 30


def missing(stage: str) -> str:
    return f"_Not measured: the `{stage}` stage has not run in this directory._\n"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def heading(title: str, field_report: str) -> str:
    """A section's title and the field report's lesson it measures."""
    return f"## {title}\n\n> **Field report:** {field_report}\n\n"


def usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} USD"
