"""The task registry and what every task shares.

A task turns benchmark items (hanlm.testsets.readers.Item) into harness calls and each item into a
sample (`item_id`, the model's output, `prediction`, `gold`, per-item `scores`); `aggregate`
turns samples into metrics {name: {value, stderr, n}}. A module adds its task with the
`@register` decorator; `get(name)` imports the built-in task modules on first use.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from hanlm.data import dataset_repo
from hanlm.errors import UserError
from hanlm.testsets import readers

TASKS: dict[str, type[Task]] = {}
TASK_FILE_SUFFIXES = (".toml", ".yaml", ".yml")  # a task of the user's: evals.tasks.task_file
# Built-in task modules, imported on first lookup; one that is not there (yet) is skipped.
BUILTIN_MODULES = ("kobest", "gsm8k_ko", "ifeval_ko", "direction", "demo_qa", "repetition")


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


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{module}":
                raise


def names() -> list[str]:
    _load_builtins()
    return sorted(TASKS)


def with_prompt_form(item):
    """`item` with the context its task scores as another form to look for when it leaks.

    Only for items of one part (a SentiNeg sentence): their bare short text counts as a leak
    only as a whole segment, so lm-eval's prompt around it ("문장: … 긍부정:") is found through
    this form; items of several parts are found in the prompt by their parts."""
    task = _task_for_benchmark(item.benchmark)
    if len(item.parts) != 1 or task is None or not hasattr(task, "context"):
        return item
    return replace(item, forms=(task.context(item.fields),))


@functools.cache
def _task_for_benchmark(benchmark: str) -> Task | None:
    _load_builtins()
    for cls in TASKS.values():
        if cls.benchmark == benchmark:
            return cls()
    return None


def get(name: str) -> Task:
    """A task by name: hanlm's own, else one of lm-evaluation-harness's registry."""
    _load_builtins()
    if name in TASKS:
        return TASKS[name]()
    from hanlm.evals.tasks import lm_eval_registry, task_file  # deferred: they import this module

    if task_file.is_task_file(name):
        return task_file.FileTask(name)

    if lm_eval_registry.is_task(name):
        return lm_eval_registry.LmEvalTask(name)
    raise UserError(f"unknown eval task {name!r}", fix=_unknown_fix())


def _unknown_fix() -> str:
    from hanlm.evals.tasks import lm_eval_registry  # deferred: it imports this module

    own = f"choose one of {', '.join(names())}"
    if not lm_eval_registry.available():
        return f"{own}, or install lm-evaluation-harness ({lm_eval_registry.INSTALL}) for its tasks"
    return f"{own}, or a task or group of lm-evaluation-harness (`lm-eval ls tasks` lists them)"


def split_specs(specs: Sequence[str]) -> list[str]:
    """Task specs as given (repeated, or comma-separated as lm-eval's --tasks a,b), one each."""
    return [part.strip() for spec in specs for part in spec.split(",") if part.strip()]


def expand_specs(specs: Sequence[str]) -> tuple[list[str], list]:
    """Every spec's tasks, one spec each (`kmmlu=DIR` -> `kmmlu_accounting=DIR`, ...), and the
    groups they came from (lm_eval_registry.GroupSpec, innermost first). A group's task that
    hanlm has itself (KoBEST's) is hanlm's."""
    leaves: list[str] = []
    groups: list = []
    for spec in split_specs(specs):
        name, source = parse_task_spec(spec)
        if name in TASKS or name.lower().endswith(TASK_FILE_SUFFIXES):
            found = [name]
        else:
            from hanlm.evals.tasks import lm_eval_registry  # deferred: it imports this module

            found, inner = lm_eval_registry.expand(name)
            groups += [g for g in inner if g.name not in {h.name for h in groups}]
        for leaf in found:
            leaf_spec = f"{leaf}={source}" if source else leaf
            if leaf_spec not in leaves:
                leaves.append(leaf_spec)
    return leaves, groups


def parse_task_spec(spec: str) -> tuple[str, str | None]:
    """`NAME` or `NAME=PATH` (PATH may be hf:DATASET[:CONFIG][:SPLIT])."""
    name, sep, source = spec.partition("=")
    name, source = name.strip(), source.strip()
    if not name or (sep and not source):
        raise UserError(f"bad task {spec!r}", fix="write --task NAME or --task NAME=PATH")
    _load_builtins()
    if name.lower().endswith(TASK_FILE_SUFFIXES):
        if sep:
            raise UserError(
                f"bad task {spec!r}", fix="a task file takes no =PATH: it names its items itself"
            )
        return name, None
    if name not in TASKS:
        from hanlm.evals.tasks import lm_eval_registry  # deferred: it imports this module

        if not lm_eval_registry.is_lm_eval_name(name):
            raise UserError(f"unknown eval task {name!r}", fix=_unknown_fix())
    return name, source or None
