"""A stage folder's completion marker (stage.json): written last inside the folder, it says the
stage finished, and with which fingerprint; a folder without one is not complete."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hanlm.files import STAGE_MARKER, atomic_write_json, read_json


def write_stage_marker(stage_dir: Path, stage: str, fp: str, **extra: Any) -> None:
    """Written last inside a stage's (temporary) folder: the stage is complete for `fp`."""
    marker = {"stage": stage, "fingerprint": fp, "finished_at": time.time(), **extra}
    atomic_write_json(Path(stage_dir) / STAGE_MARKER, marker)


def read_stage_marker(stage_dir: Path) -> dict | None:
    """A complete stage folder's marker (stage, fingerprint, version, ...), or None when the
    folder is not complete."""
    marker = Path(stage_dir) / STAGE_MARKER
    if not marker.is_file():
        return None
    try:
        data = read_json(marker)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "fingerprint" in data else None


def stage_fingerprint(stage_dir: Path) -> str | None:
    """The fingerprint a complete stage folder was made with, or None when it is not complete."""
    marker = read_stage_marker(stage_dir)
    return None if marker is None else marker["fingerprint"]
