"""What every config section shares: the Section base, the device spelling, source names and
the shares of a mixture, and [run]."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(Section):
    """Settings shared by every stage."""

    seed: int = Field(0, description="seed of every random choice in the run")


_NO_FLAG: dict[str, Any] = {"cli": {"flag": False}}  # a key with no flag: --set KEY=VALUE only


# --- the sources of a mixture, corpus and chat alike ------------------------------------------

SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def plain_source_name(name: str) -> str:
    """A source's name as every table and file name shows it (corpus and chat sources alike)."""
    if not SOURCE_NAME.fullmatch(name):
        raise ValueError(
            f"source name {name!r} must be 1-64 letters, digits, '_', '.' or '-', starting "
            "with a letter or digit"
        )
    return name


SourceName = Annotated[str, AfterValidator(plain_source_name)]


def _names_once(table: str, sources: list) -> None:
    names = [s.name for s in sources]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{table} names {', '.join(repeated)} more than once")


WEIGHT_TOLERANCE = 1e-3  # weights are shares: they must sum to 1 within this
EPOCHS_WARNING = 4.0  # past ~4 epochs repeated tokens are worth much less (Muennighoff et al. 2023)


# --- one device spelling everywhere ----------------------------------------------------------------

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def check_device(value: str) -> str:
    """auto, cpu, cuda or cuda:N: the one device spelling of every section."""
    if value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value or ""):
        return value
    raise ValueError(f"unknown device {value!r}: use {DEVICE_CHOICES}")


Device = Annotated[str, AfterValidator(check_device)]
