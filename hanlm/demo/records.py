"""What the demo world records of itself for the report card to read back: each planted copy
of a benchmark item (planted.json), as a type, so a damaged file is a clear error."""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from hanlm.errors import UserError
from hanlm.files import read_json
from hanlm.results import Part


class PlantedCopy(Part):
    """One copy of a benchmark item the demo world planted into one of its documents."""

    item_id: str
    plant_style: str  # verbatim, respaced, repunctuated, embedded
    document_id: str


def read_planted(path: Path) -> list[PlantedCopy] | None:
    """The planted copies of a demo world's planted.json; None where there is none (a run on
    other data)."""
    if not Path(path).is_file():
        return None
    try:
        return TypeAdapter(list[PlantedCopy]).validate_python(read_json(path))
    except ValidationError as e:
        raise UserError(
            f"{path} is not the demo world's planted items: {str(e).splitlines()[0]}",
            where=str(path),
            fix="run `hanlm demo` (or `hanlm run --from corpus`) to write the demo world again",
        ) from None
