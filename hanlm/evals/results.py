"""What an evaluation hands over, with a declared shape (hanlm.results): results.json. Kept apart
from the evaluation code so that what reads it (the report card, the model card, publishing)
does not import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hanlm.results import Part, Result, read_records


class Score(Part):
    """One metric on one split of a task's items: the mean, its standard error, the items."""

    value: float | None
    stderr: float | None
    n: int


class TaskRecord(Part):
    benchmark: str | None  # the benchmark decontamination checks it against, if any
    source: str | None  # where its items came from
    items: int


# a task's scores: split (full, clean, dirty, partial) -> metric -> score
TaskScores = dict[str, dict[str, Score]]


class EvalResults(Result):
    """`eval/results.json` (or OUT/results.json of `hanlm eval --out`): every model's scores by
    task, split and metric (lm-eval's results with the contamination splits added), the item
    counts, and the fingerprint that marks the folder as hanlm's."""

    FILE = "results.json"
    MADE_BY = "eval"

    models: list[str]
    model_dirs: dict[str, str]
    tasks: dict[str, TaskRecord]
    # a group (lm-eval's kmmlu, ...) -> its members, tasks or groups
    groups: dict[str, list[str]] = Field(default_factory=dict)
    contamination: str | None  # the decontamination items.jsonl the splits come from
    contamination_splits: str | None  # how the splits are made, in words
    results: dict[str, dict[str, TaskScores]]  # model -> task or group -> split -> metric -> score
    counts: dict[str, dict[str, dict[str, int]]]  # model -> task -> split -> items
    seconds: float
    fingerprint: str
    # the entries hanlm wrote into the folder (files.OUTPUT_FILES_KEY): added when the file is
    # the marker of a folder of the user's choosing (`hanlm eval --out`), not the stage's
    output_files: list[str] | None = None


class EvalSample(BaseModel):
    """One line of `eval/samples.jsonl`: one item as one model answered it, scored. A task's own
    fields (the direction probe's `reverse_stated` and `choices`, the log-likelihoods, a
    generation's prompt) ride along by name: they are the task's, read by the task's statistics."""

    model_config = ConfigDict(extra="allow")

    model: str
    task: str
    item_id: str | int
    prediction: Any
    gold: Any = None
    scores: dict[str, Any]  # per-item metric -> its value
    contamination: str | None = None  # the item's decontam status, for a benchmark task


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The samples of a samples.jsonl, each checked as an `EvalSample`, as the records the
    contamination statistics take ([] when the eval did not run; see
    hanlm.results.read_records)."""
    fix = "run `hanlm eval --run RUN --force` to write them again"
    samples = read_records(path, EvalSample, what="an eval sample", fix=fix)
    return [sample.model_dump(exclude_unset=True) for sample in samples]
