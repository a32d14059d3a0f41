"""Split eval samples by the decontamination report: full, clean, dirty (and partial apart).

`decontam` writes one line per benchmark item to items.jsonl with status dirty, partial or clean.
Splits: `full` is every item; `clean` the items found clean; `dirty` every item with any
overlap (status dirty or partial), so clean + dirty = full for checked items; `partial` repeats
the partial ones alone. Items the report does not list count only in `full` (their number is
reported as `unchecked`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hanlm.data.decontam.outputs import ITEMS_FILE
from hanlm.errors import UserError

STATUSES = ("dirty", "partial", "clean")
SPLITS = ("full", "clean", "dirty", "partial")


def load_statuses(path: str | Path) -> dict[tuple[str, str], str]:
    """(benchmark, item_id) -> status, from a decontamination items.jsonl."""
    path = Path(path)
    if path.is_dir():
        path = path / ITEMS_FILE
    if not path.is_file():
        raise UserError(
            f"contamination report {path} does not exist",
            fix="run `hanlm decontam` (it writes RUN/decontam/items.jsonl) or drop --contamination",
        )
    statuses: dict[tuple[str, str], str] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                key = (str(row["benchmark"]), str(row["item_id"]))
                status = row["status"]
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(
                    f"bad line in the contamination report: {e}",
                    where=f"{path}:{number}",
                    fix="each line needs benchmark, item_id and status (dirty, partial or clean)",
                ) from None
            if status not in STATUSES:
                raise UserError(
                    f"unknown status {status!r}",
                    where=f"{path}:{number}",
                    fix=f"use one of {', '.join(STATUSES)}",
                )
            statuses[key] = status
    return statuses


def split_samples(
    samples: Sequence[dict], benchmark: str | None, statuses: dict[tuple[str, str], str] | None
) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Samples by split, and item counts per split plus `unchecked`."""
    if statuses is None or benchmark is None:
        return {"full": list(samples)}, {"full": len(samples)}
    splits: dict[str, list[dict]] = {name: [] for name in SPLITS}
    unchecked = 0
    for sample in samples:
        splits["full"].append(sample)
        status = statuses.get((benchmark, str(sample["item_id"])))
        sample["contamination"] = status
        if status is None:
            unchecked += 1
        elif status == "clean":
            splits["clean"].append(sample)
        else:
            splits["dirty"].append(sample)
            if status == "partial":
                splits["partial"].append(sample)
    counts = {name: len(rows) for name, rows in splits.items()}
    counts["unchecked"] = unchecked
    return splits, counts
