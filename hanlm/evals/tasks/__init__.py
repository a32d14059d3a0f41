"""The task registry and what every task shares.

A task turns benchmark items (hanlm.testsets.readers.Item) into harness calls and each item into a
sample (`item_id`, the model's output, `prediction`, `gold`, per-item `scores`); `aggregate`
turns samples into metrics {name: {value, stderr, n}}. A module adds its task with the
`@register` decorator (hanlm.evals.tasks.base); `get(name)` imports the built-in task modules
on first use.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from dataclasses import replace

from hanlm.errors import UserError
from hanlm.evals.tasks import lm_eval_registry, task_file
from hanlm.evals.tasks.base import (
    TASK_FILE_SUFFIXES,
    TASKS,
    Options,
    Task,
    fetch_hf,
    macro_f1,
    mean_metric,
    register,
)

__all__ = [  # the package's face: the registry's lookups, and what a task is made of (base)
    "BUILTIN_MODULES", "TASKS", "TASK_FILE_SUFFIXES", "Options", "Task", "expand_specs", "fetch_hf",
    "get", "macro_f1", "mean_metric", "names", "parse_task_spec", "register", "split_specs",
    "with_prompt_form",
]  # fmt: skip
# Built-in task modules, imported on first lookup; one that is not there (yet) is skipped.
BUILTIN_MODULES = ("kobest", "gsm8k_ko", "ifeval_ko", "direction", "demo_qa", "repetition")


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

    if task_file.is_task_file(name):
        return task_file.FileTask(name)

    if lm_eval_registry.is_task(name):
        return lm_eval_registry.LmEvalTask(name)
    raise UserError(f"unknown eval task {name!r}", fix=_unknown_fix())


def _unknown_fix() -> str:

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
    if name not in TASKS and not lm_eval_registry.is_lm_eval_name(name):
        raise UserError(f"unknown eval task {name!r}", fix=_unknown_fix())
    return name, source or None
