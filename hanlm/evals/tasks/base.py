"""What every task shares: the Task base class, its options, the metrics' helpers, and the
registry tasks add themselves to with `@register` (hanlm.evals.tasks looks names up in it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hanlm.data import dataset_repo
from hanlm.errors import UserError
from hanlm.testsets import readers

TASKS: dict[str, type[Task]] = {}
TASK_FILE_SUFFIXES = (".toml", ".yaml", ".yml")  # a task of the user's: evals.tasks.task_file


@dataclass
class Options:
    """Settings a task may use (from the `eval` config section)."""

    limit: int | None = None
    num_fewshot: int = 0
    max_new_tokens: int = 256
    distractors: int = 4
    chat_template: bool = False
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Task:
    """One evaluation task; subclasses set `name` and implement `load`, `evaluate`."""

    name: ClassVar[str]
    # the readers benchmark (also the name decontamination reports items under)
    benchmark: ClassVar[str | None] = None
    # data used when --task names no path: a file of the run's demo world, or an hf: id
    where_to_get: ClassVar[str] = ""

    def default_source(self, demo_files: Mapping[str, Path] | None) -> str | None:
        """The data used when --task names no path; `demo_files` are the demo world's files by
        kind (pretrain, benchmark, facts, ...) when the task runs in a run, else None."""
        return None

    def load(
        self, source: str | None, *, demo_files: Mapping[str, Path] | None, options: Options
    ) -> list:
        source = source or self.default_source(demo_files)
        if source is None:
            raise UserError(
                f"task {self.name} needs data and none was given",
                fix=f"write --task {self.name}=PATH; get the data from {self.where_to_get}",
            )
        if source.startswith("hf:"):
            path = fetch_hf(source, self.name, self.where_to_get)
        else:
            path = Path(source)
            if not path.exists():
                raise UserError(
                    f"{self.name}: data file {path} does not exist",
                    fix=f"get the data from {self.where_to_get}",
                )
        items = readers.read(self.benchmark or self.name, path)
        return items

    def evaluate(self, model, items: Sequence, options: Options) -> list[dict]:
        raise NotImplementedError

    def aggregate(self, samples: Sequence[dict]) -> dict[str, dict]:
        """Mean of each per-item score with its standard error."""
        names: list[str] = []
        for s in samples:
            names += [k for k in s["scores"] if k not in names]
        return {name: mean_metric([s["scores"][name] for s in samples]) for name in names}


def mean_metric(values: Sequence[float]) -> dict:
    n = len(values)
    if n == 0:
        return {"value": None, "stderr": None, "n": 0}
    mean = sum(values) / n
    if n < 2:
        return {"value": mean, "stderr": None, "n": n}
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return {"value": mean, "stderr": math.sqrt(variance / n), "n": n}


def macro_f1(golds: Sequence[int], preds: Sequence[int]) -> float:
    """Macro-averaged F1 over the labels that occur in gold or prediction (as scikit-learn)."""
    labels = sorted(set(golds) | set(preds))
    scores = []
    for label in labels:
        tp = sum(1 for g, p in zip(golds, preds, strict=True) if g == label and p == label)
        fp = sum(1 for g, p in zip(golds, preds, strict=True) if g != label and p == label)
        fn = sum(1 for g, p in zip(golds, preds, strict=True) if g == label and p != label)
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return sum(scores) / len(scores) if scores else 0.0


def fetch_hf(source: str, task: str, where_to_get: str) -> Path:
    """`hf:NAME[@REVISION][:CONFIG]:SPLIT` (a Hub id or a local snapshot folder) -> a local
    JSONL copy of that split's rows."""
    try:
        return dataset_repo.local_copy(source)
    except UserError as e:
        fix = f"{e.fix}; source: {where_to_get}" if e.fix else f"source: {where_to_get}"
        raise UserError(f"{task}: {e.what}", where=e.where, fix=fix) from None


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available under its `name`."""
    TASKS[cls.name] = cls
    return cls
