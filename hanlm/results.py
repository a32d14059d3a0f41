"""What a stage hands over, with a declared shape: the base of every result type.

Each layer that makes a stage's result declares its type in a module that does not import
torch (`hanlm.plan.estimate.Plan`, `hanlm.data.corpus.CorpusStats`, `hanlm.train.results`,
`hanlm.evals.results.EvalResults`, ...), as a `Result`: a pydantic model whose `FILE` names the
JSON file it lives in. `write` is the one writer (atomic, so a reader never sees half a file)
and `read` the one reader, which turns a missing, damaged or wrongly shaped file into a
UserError naming the file, what is wrong and how to make it again. The report card, the model
card and publishing read results only through these types, without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from hanlm.errors import UserError
from hanlm.files import atomic_write_json, read_jsonl

R = TypeVar("R", bound="Result")


class Part(BaseModel):
    """A nested part of a result: unknown keys are an error, as in the result itself."""

    model_config = ConfigDict(extra="forbid")


class Result(Part):
    """A stage's result file. Subclasses set `FILE` (the name inside the stage's folder) and
    `MADE_BY` (the stage that writes it, for the fix a reader's error suggests)."""

    FILE: ClassVar[str]
    MADE_BY: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """Its JSON: the keys it was made with (an optional part left out stays out, so the
        file keeps the shape its producer gave it)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def write(self, path: Path) -> Path:
        """The one writer: the result as JSON at `path`, atomically."""
        atomic_write_json(Path(path), self.to_json())
        return Path(path)

    @classmethod
    def read(cls: type[R], path: Path, *, fix: str | None = None) -> R:
        """The one reader: the file at `path` validated as this type; a missing, damaged or
        wrongly shaped file is a UserError naming it (`fix`: how to make it again, by default
        the stage that writes it)."""
        path = Path(path)
        fix = fix or (
            f"make it again with `hanlm {cls.MADE_BY} --run RUN --force` (or `hanlm run --run RUN "
            f"--from {cls.MADE_BY}`)"
        )
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(
                f"no {cls.__name__} file: {path} is missing", where=str(path), fix=fix
            ) from None
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(
                f"cannot read the {cls.__name__} file ({e})", where=str(path), fix=fix
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(
                f"the {cls.__name__} file is damaged: not JSON ({e})", where=str(path), fix=fix
            ) from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise UserError(
                f"the {cls.__name__} file does not have the shape hanlm writes: {_first_errors(e)}",
                where=str(path),
                fix=fix,
            ) from None

    @classmethod
    def read_if_present(cls: type[R], path: Path, *, fix: str | None = None) -> R | None:
        """None when there is no file (the stage has not run); otherwise as `read`."""
        return cls.read(path, fix=fix) if Path(path).exists() else None

    @classmethod
    def is_one(cls, path: Path) -> bool:
        """Whether the file at `path` reads as this type."""
        try:
            cls.read(path)
        except UserError:
            return False
        return True


M = TypeVar("M", bound=BaseModel)


def read_records(path: Path, kind: type[M], *, what: str, fix: str) -> list[M]:
    """The records of a JSONL file hanlm appends to, each validated as `kind` ([] when there is
    no file: the stage did not run). A last line a crash cut short is dropped and a damaged line
    is a DamagedFile (hanlm.files.read_jsonl); a line that is not `what` is a UserError naming
    the file and the line, with `fix`."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for number, row in enumerate(read_jsonl(path), 1):
        try:
            records.append(kind.model_validate(row))
        except ValidationError as e:
            raise UserError(
                f"line {number} of {path.name} is not {what}: {_first_errors(e)}",
                where=str(path),
                fix=fix,
            ) from None
    return records


def _first_errors(error: ValidationError, limit: int = 3) -> str:
    problems = [
        f"{'.'.join(str(p) for p in e['loc']) or 'the whole file'}: {e['msg']}"
        # an unknown key first: it says most plainly that this is another kind of file
        for e in sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")[:limit]
    ]
    more = error.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
