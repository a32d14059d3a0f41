"""Split eval samples by the decontamination report: full, clean, dirty (and partial apart).

`decontam` writes one line per benchmark item to items.jsonl with status dirty, partial or clean.
Splits: `full` is every item; `clean` the items found clean; `dirty` every item with any
overlap (status dirty or partial), so clean + dirty = full for checked items; `partial` repeats
the partial ones alone. Items the report does not list count only in `full` (their number is
reported as `unchecked`).

`dirty_clean_gap` puts a bootstrap confidence interval over items on a split's mean score and on
dirty minus clean, so a gap can be told from the noise of a few hundred items.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


# The bootstrap behind every interval the report prints: fixed, so a rerun prints the same.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Interval:
    """A mean over items with its percentile bootstrap interval."""

    value: float
    low: float
    high: float
    count: int

    def excludes(self, point: float) -> bool:
        return not self.low <= point <= self.high

    def as_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.count}


def _resampled_means(values, rng, resamples: int):
    import numpy as np  # deferred: the CLI's import stays light

    values = np.asarray(values, dtype=np.float64)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    return values[picks].mean(axis=1)


def _interval(value: float, means, count: int, confidence: float) -> Interval:
    import numpy as np  # deferred: the CLI's import stays light

    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(value), float(low), float(high), count)


def dirty_clean_gap(
    clean: Sequence[float],
    dirty: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = BOOTSTRAP_CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Interval]:
    """Clean mean, dirty mean and dirty minus clean, each with a percentile bootstrap interval.

    Items are resampled with replacement within each split (the splits are fixed by the
    decontamination report, so each keeps its size); the gap's interval comes from the same
    resamples, paired draw by draw."""
    import numpy as np  # deferred: the CLI's import stays light

    if len(clean) == 0 or len(dirty) == 0:
        raise ValueError("both splits need at least one item")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError("resamples must be positive and confidence between 0 and 1")
    rng = np.random.default_rng(seed)
    clean_means = _resampled_means(clean, rng, resamples)
    dirty_means = _resampled_means(dirty, rng, resamples)
    clean_value, dirty_value = float(np.mean(clean)), float(np.mean(dirty))
    return {
        "clean": _interval(clean_value, clean_means, len(clean), confidence),
        "dirty": _interval(dirty_value, dirty_means, len(dirty), confidence),
        "gap": _interval(
            dirty_value - clean_value,
            dirty_means - clean_means,
            len(clean) + len(dirty),
            confidence,
        ),
    }


def scores_by_split(samples: Sequence[dict], metric: str) -> dict[str, list[float]]:
    """A metric's per-item scores, split clean / dirty by the `contamination` status that
    `split_samples` wrote into each sample (samples.jsonl keeps it)."""
    out: dict[str, list[float]] = {"clean": [], "dirty": []}
    for sample in samples:
        status, value = sample.get("contamination"), sample["scores"].get(metric)
        if status is None or value is None:
            continue
        out["clean" if status == "clean" else "dirty"].append(float(value))
    return out


def paired_dirty_clean_gap(with_leaks: Sequence[dict], without: Sequence[dict], metric: str):
    """Item by item, the score of a model trained with the leaked documents minus one trained on
    the same recipe without them, split clean / dirty by the first's statuses; None unless both
    splits have items. Its dirty minus clean (a difference of differences) is what the leaks add,
    apart from how hard the leaked items happen to be and from what the rest of the corpus change
    does to every item."""
    other = {s["item_id"]: s["scores"].get(metric) for s in without}
    paired = [
        {**s, "scores": {metric: s["scores"][metric] - other[s["item_id"]]}}
        for s in with_leaks
        if s["scores"].get(metric) is not None and other.get(s["item_id"]) is not None
    ]
    split = scores_by_split(paired, metric)
    if not (split["clean"] and split["dirty"]):
        return None
    return dirty_clean_gap(split["clean"], split["dirty"])
