"""Tasks from lm-evaluation-harness's task registry (KMMLU, HAE-RAE, CLIcK, KorMedMCQA, any other):
lm-eval defines them (data set, prompt, choices, target, few-shot, filters, metrics) and builds
their requests; hanlm's harness scores them (hanlm.evals.lm_eval_model), and every score is split
clean / dirty like a built-in task's.

A name is looked up in lm-eval's index: a task, or a group or tag that expands to its tasks.
Indexing all of lm-eval's ~14,000 YAML files takes tens of seconds, so only the task folders
whose files mention the name are indexed (found by reading the files' text, about a second).

Data: the Hugging Face Hub when online; or a local copy in the published layout, the data set's
repository as `hf download REPO --repo-type dataset --local-dir DIR/REPO` writes it, given as
`--task NAME=DIR` (or `eval.data_dir`): lm-eval then reads DIR/REPO instead of REPO.

Decontamination: each test document becomes a `readers.Item` (benchmark = the task's name, id =
its position, lm-eval's doc_id) whose parts are its natural texts, the question and the right
answer's text (not its letter), and whose form is the prompt lm-eval scores followed by the
right answer.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hanlm.errors import UserError
from hanlm.evals.tasks.base import Options, Task, mean_metric
from hanlm.testsets.readers import Item

INSTALL = "pip install 'hanlm[lm-eval]'"
_LABEL = re.compile(r"^\(?([A-Za-z0-9])[).]?$")  # an answer given by its option label: A, (A), 1.


def available() -> bool:
    try:
        import lm_eval  # noqa: F401  # deferred: optional, and seconds to import
    except ImportError:
        return False
    return True


@functools.cache
def _manager(folders: tuple[str, ...] | None):
    from lm_eval.tasks import TaskManager  # deferred: optional, and seconds to import

    logging.getLogger("lm-eval").setLevel(logging.ERROR)  # its index logs every skipped file
    if folders is None:
        manager = TaskManager()
    else:
        manager = TaskManager(include_path=list(folders), include_defaults=False)
    _built.append(manager)
    return manager


_built: list = []  # every task manager made so far, by _manager
_kinds: dict[int, tuple[frozenset, frozenset]] = {}  # id(manager) -> (its groups, its tags)


def _kind(manager, name: str) -> str:
    """What `name` is in `manager`'s index: "group", "tag" or "task", by TaskManager's public
    lists (all_groups, all_tags; every other entry is a task)."""
    if id(manager) not in _kinds:
        _kinds[id(manager)] = (frozenset(manager.all_groups), frozenset(manager.all_tags))
    groups, tags = _kinds[id(manager)]
    return "group" if name in groups else "tag" if name in tags else "task"


@functools.cache
def _task_files() -> tuple[tuple[str, str], ...]:
    """(family folder, text) of every YAML file of lm-eval's tasks: ~14,000, read in ~1 s."""
    import lm_eval  # deferred: as above

    root = Path(lm_eval.__file__).parent / "tasks"
    return tuple(
        (str(root / path.relative_to(root).parts[0]), path.read_text(errors="replace"))
        for path in root.rglob("*.yaml")
    )


def _registry(name: str):
    """The task manager whose index has `name`, or None. Indexing all of lm-eval's tasks takes
    tens of seconds, so only the family folders whose files mention the name are indexed (all
    of them only when that is not enough)."""
    for built in _built:  # a group's tasks are in the index that found the group
        if name in built.task_index:
            return built
    mention = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
    folders = tuple(sorted({folder for folder, text in _task_files() if mention.search(text)}))
    if not folders:
        return None
    for choice in (folders, None):
        manager = _manager(choice)
        if name in manager.task_index:
            return manager
    return None


def is_lm_eval_name(name: str) -> bool:
    """Whether lm-eval's registry has `name`: a task, group or tag."""
    return available() and _registry(name) is not None


def is_task(name: str) -> bool:
    """Whether `name` is one task of lm-eval's registry (not a group or tag)."""
    if not is_lm_eval_name(name):
        return False
    return _kind(_registry(name), name) == "task"


@dataclass(frozen=True)
class GroupSpec:
    """A group of lm-eval's: its members (tasks or groups) and how its metrics are combined."""

    name: str
    members: tuple[str, ...]
    metrics: tuple[dict, ...]  # aggregate_metric_list: {metric, aggregation, weight_by_size}


def expand(name: str) -> tuple[list[str], list[GroupSpec]]:
    """The tasks `name` stands for (itself, or a group's or tag's, recursively) and the groups
    among them, innermost first."""
    manager = _registry(name)
    if manager is None:
        raise UserError(f"unknown eval task {name!r}: not hanlm's, nor in lm-eval's registry")
    index = manager.task_index
    tasks: list[str] = []
    groups: list[GroupSpec] = []

    def visit(entry_name: str) -> list[str]:
        entry = index[entry_name]
        kind = _kind(manager, entry_name)
        if kind == "tag":
            members = sorted(entry.tags)
            for member in members:
                visit(member)
            return members
        if kind != "group":
            if entry_name not in tasks:
                tasks.append(entry_name)
            return [entry_name]
        members = []
        for member in (entry.cfg or {}).get("task", []):
            member_name = member if isinstance(member, str) else member.get("task")
            if member_name is None or member_name not in index:
                raise UserError(
                    f"lm-eval group {entry_name} has a member hanlm cannot run: {member!r}",
                    fix="name its tasks one by one",
                )
            if _kind(manager, member_name) == "tag":
                members += visit(member_name)  # a tag's tasks are the group's own members
            else:
                visit(member_name)
                members.append(member_name)
        groups.append(
            GroupSpec(
                entry_name,
                tuple(members),
                tuple((entry.cfg or {}).get("aggregate_metric_list") or ()),
            )
        )
        return [entry_name]

    visit(name)
    return tasks, groups


class LmEvalTask(Task):
    """One task of lm-eval's registry, its requests scored by hanlm's harness."""

    where_to_get = "the Hugging Face Hub (online), or a local copy given as --task NAME=DIR"

    def __init__(self, name: str):
        self.name = self.benchmark = name
        self._task = None  # the lm-eval task object, built by load()

    def default_source(self, demo_files) -> str | None:
        """The Hub data set and split it reads by default (lm-eval scores the test split, else
        the validation one), as `hf:REPO[:CONFIG]:SPLIT` (what a model card cites)."""
        config = _registry(self.name).task_index[self.name].cfg or {}
        repo, subset = config.get("dataset_path"), config.get("dataset_name")
        split = config.get("test_split") or config.get("validation_split")
        if not repo or not split:
            return None
        return f"hf:{repo}:{subset}:{split}" if subset else f"hf:{repo}:{split}"

    def load(self, source, *, demo_files, options: Options) -> list[Item]:
        self._task = self._build(source, options)
        docs = list(self._task.eval_docs)
        template = _template_lines(self._task, docs)
        return [self._item(str(i), doc, template) for i, doc in enumerate(docs)]

    def _build(self, source, options: Options):
        """lm-eval's task object, its data loaded."""
        local = None if source is None or str(source).startswith("hf:") else source
        return build(self.name, local, options)

    def _item(self, item_id: str, doc: Mapping, template: frozenset[str]) -> Item:
        task = self._task
        fields = {k: _plain(v) for k, v in dict(doc).items()}
        prompt = task.doc_to_text(doc)
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        answer = _answer_text(task, doc, prompt)
        parts = tuple(p for p in (*_question_parts(doc, prompt, task, template), answer) if p)
        delimiter = task.config.target_delimiter or ""
        choice = _gold_choice(task, doc)
        form = f"{prompt}{delimiter}{choice}" if choice is not None else prompt
        return Item(self.name, item_id, fields, "\n".join(parts), parts, (form,))

    def evaluate(self, model, items: Sequence[Item], options: Options) -> list[dict]:
        from lm_eval.evaluator import evaluate as lm_evaluate  # deferred: lm-eval is optional

        from hanlm.evals.lm_eval_model import HarnessLM  # deferred: it imports torch and lm-eval

        if self._task is None:
            raise RuntimeError("load() the task before evaluating it")
        positions = [int(item.item_id) for item in items]
        out = lm_evaluate(
            lm=HarnessLM(model),
            task_dict={"tasks": {self.name: self._task}},
            samples={self.name: positions},
            bootstrap_iters=0,
            log_samples=True,
            apply_chat_template=options.chat_template,
        )
        by_id = {sample["doc_id"]: sample for sample in out["samples"][self.name]}
        self._metrics = [m for m in self._task.aggregation() if m in next(iter(by_id.values()))]
        multiple_choice = self._task.config.output_type == "multiple_choice"
        samples = []
        for position in positions:
            logged = by_id[position]
            sample = {
                "item_id": str(position),
                "prompt": logged["arguments"][0][0] if logged["arguments"] else None,
                "target": _plain(logged["target"]),
            }
            if multiple_choice:  # as hanlm's own multiple-choice tasks record them
                lls = [float(r[0]) for r in logged["filtered_resps"]]
                sample["loglikelihoods"] = lls
                sample["prediction"] = max(range(len(lls)), key=lls.__getitem__) if lls else None
            else:  # what the model wrote, and what the task's filters made of it
                sample["generations"] = _plain(logged["resps"])
                sample["responses"] = _plain(logged["filtered_resps"])
            sample["scores"] = {m: _plain(logged[m]) for m in self._metrics}
            samples.append(sample)
        return samples

    def aggregate(self, samples: Sequence[dict]) -> dict[str, dict]:
        """lm-eval's own aggregation of each metric (mean, or a corpus-level one such as F1),
        with the standard error of a mean."""
        aggregations = self._task.aggregation()
        metrics = {}
        names = [m for m in aggregations if any(m in s["scores"] for s in samples)]
        for name in names:
            values = [_as_lm_eval_value(s["scores"][name]) for s in samples]
            if not values:
                metrics[name] = {"value": None, "stderr": None, "n": 0}
                continue
            if all(isinstance(v, (int, float)) for v in values):
                metrics[name] = mean_metric([float(v) for v in values])
                metrics[name]["value"] = float(aggregations[name](values))
            else:
                metrics[name] = {"value": float(aggregations[name](values)), "stderr": None}
                metrics[name]["n"] = len(values)
        return metrics


def aggregate_group(group: GroupSpec, member_results: Sequence[dict[str, dict]]) -> dict:
    """A group's metrics from its members' (one split): lm-eval's aggregate_metric_list, a mean
    weighted by size unless it says otherwise, with the pooled standard error."""
    # deferred: lm-eval is optional
    from lm_eval.api.metrics import aggregate_subtask_metrics, pooled_sample_stderr

    metrics = {}
    for spec in group.metrics:
        name = spec["metric"]
        present = [r[name] for r in member_results if r.get(name, {}).get("value") is not None]
        sizes = [m["n"] for m in present]
        if not present or not sum(sizes):
            metrics[name] = {"value": None, "stderr": None, "n": 0}
            continue
        weight_by_size = spec.get("weight_by_size", True)
        value = aggregate_subtask_metrics([m["value"] for m in present], sizes, weight_by_size)
        stderrs = [m.get("stderr") for m in present]
        stderr = None
        if all(s is not None for s in stderrs) and all(n > 1 for n in sizes):
            stderr = pooled_sample_stderr(stderrs, sizes)
            stderr = None if math.isnan(stderr) else float(stderr)
        metrics[name] = {"value": float(value), "stderr": stderr, "n": sum(sizes)}
    return metrics


def build(name: str, data_dir: str | Path | None, options: Options):
    """lm-eval's task `name` with its data loaded: from DATA_DIR/<its dataset_path> when a local
    copy is given, else from the Hub. Errors name what to download and where to put it."""
    manager = _registry(name)
    overrides: dict[str, Any] = {"task": name}
    config = manager.task_index[name].cfg or {}
    repo = config.get("dataset_path")
    local = None
    if data_dir is not None and repo:
        local = Path(data_dir).expanduser() / repo
        if not local.is_dir():
            raise UserError(
                f"{name}: no local copy of {repo} in {data_dir}",
                where=str(local),
                fix=f"download it: hf download {repo} --repo-type dataset --local-dir {local}",
            )
        overrides["dataset_path"] = str(local)
        # datasets caches a local repository by its README's (relative) file list, so another
        # copy, or this one updated, would read what an earlier one held: a cache of its own
        kwargs = dict(config.get("dataset_kwargs") or {})
        cache = tempfile.mkdtemp(prefix="hanlm-datasets-")
        atexit.register(shutil.rmtree, cache, ignore_errors=True)  # read for this process only
        overrides["dataset_kwargs"] = {**kwargs, "cache_dir": cache}
    if options.num_fewshot:
        overrides["num_fewshot"] = options.num_fewshot
    wrapper = {"group": f"hanlm::{name}", "task": [overrides]}
    import datasets  # deferred: as lm-eval

    datasets.disable_progress_bars()  # a bar per split and filter, for files read in an instant
    try:
        with _offline_when(local is not None):
            return manager.load(wrapper)["tasks"][name]
    except UserError:
        raise
    except Exception as e:  # offline, a missing config or split: the user's to fix
        subset = config.get("dataset_name")
        what = f"{repo}" + (f" ({subset})" if subset else "")
        if local is not None:
            where = str(local)
            fix = (
                f"the local copy lacks {what}: download the whole data set, "
                f"hf download {repo} --repo-type dataset --local-dir {local}"
            )
        else:
            where = f"the Hugging Face Hub ({what})"
            fix = (
                "go online (unset HF_HUB_OFFLINE/HF_DATASETS_OFFLINE), or download it where you "
                f"are online, hf download {repo} --repo-type dataset --local-dir DIR/{repo}, and "
                f"name the folder: {name}=DIR"
            )
        raise UserError(
            f"{name}: cannot load its data from {where}: {type(e).__name__}: {e}", fix=fix
        ) from None


def build_from_config(config: dict, *, where: str):
    """lm-eval's task from a task config of its own (a task file's), data loaded (a cache of
    its own, as for local copies: datasets' cache of local files can be stale)."""
    import datasets  # deferred: as lm-eval
    from lm_eval.api.task import ConfigurableTask  # deferred: lm-eval is optional

    datasets.disable_progress_bars()
    cache = tempfile.mkdtemp(prefix="hanlm-datasets-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    config = {**config, "dataset_kwargs": {**config.get("dataset_kwargs", {}), "cache_dir": cache}}
    try:
        with _offline_when(True):
            return ConfigurableTask(config=config)
    except UserError:
        raise
    except Exception as e:  # the files were checked; what is left is lm-eval's to say
        raise UserError(
            f"lm-evaluation-harness cannot build the task: {type(e).__name__}: {e}", where=where
        ) from None


@contextlib.contextmanager
def _offline_when(local: bool):
    """A local copy is read without asking the Hub anything."""
    if not local:
        yield
        return
    saved = os.environ.get("HF_DATASETS_OFFLINE")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = saved


# --- the natural texts of a document, for decontamination ------------------------------------


def _gold_index(task, doc) -> int | None:
    if task.config.output_type != "multiple_choice":
        return None
    choices = task.doc_to_choice(doc)
    target = task.doc_to_target(doc)
    if isinstance(target, str):
        target = choices.index(target) if target in choices else None
    if isinstance(target, list):  # several right answers: the first
        target = target[0] if target else None
    return int(target) if target is not None else None


def _gold_choice(task, doc) -> str | None:
    index = _gold_index(task, doc)
    if index is None:
        target = task.doc_to_target(doc)
        return target if isinstance(target, str) else None
    return task.doc_to_choice(doc)[index]


def _answer_text(task, doc: Mapping, prompt: str) -> str | None:
    """The right answer as text: a choice given by its label (KMMLU's "A", HAE-RAE's "(E)",
    CLIcK's "C") is the text that label stands for: in the document (doc["A"], or the label's
    place in its list of choices) or on the label's line of the prompt."""
    choice = _gold_choice(task, doc)
    if choice is None:
        return None
    choice = choice.strip()
    label = _LABEL.match(choice)
    if label is None:
        return choice
    key = label.group(1)
    if isinstance(doc.get(key), str):
        return doc[key].strip()
    position = int(key) - 1 if key.isdigit() else ord(key.upper()) - ord("A")
    for field in ("choices", "options", "endings"):
        listed = doc.get(field)
        if isinstance(listed, (list, tuple)) and 0 <= position < len(listed):
            return str(listed[position]).strip()
    for line in prompt.splitlines():
        stripped = line.strip()
        if stripped.startswith(choice):
            return stripped[len(choice) :].lstrip(" .):：").strip()
    return None


_QUESTION_FIELDS = ("paragraph", "passage", "context", "question", "problem")


def _question_parts(doc: Mapping, prompt: str, task, template: frozenset[str]) -> list[str]:
    """The document's own question texts: its question-like fields when it has them, else the
    prompt without its template lines (`template`: those most documents share) and without the
    lines that list labelled options."""
    found = [doc[k].strip() for k in _QUESTION_FIELDS if isinstance(doc.get(k), str)]
    if any(found):
        return found
    return ["\n".join(_own_lines(prompt, task, doc, template)).strip()]


def _own_lines(prompt: str, task, doc: Mapping, template: frozenset[str]) -> list[str]:
    labels = task.doc_to_choice(doc) if task.config.output_type == "multiple_choice" else []
    labelled = [c.strip() for c in labels if _LABEL.match(c.strip())]
    return [
        line
        for line in prompt.splitlines()
        if line.strip()
        and line.strip() not in template
        and not any(line.strip().startswith(label) for label in labelled)
    ]


def _template_lines(task, docs: Sequence[Mapping]) -> frozenset[str]:
    """Prompt lines that more than half of the documents share: the task's template."""
    if len(docs) < 4:
        return frozenset()
    counts: dict[str, int] = {}
    for doc in docs:
        prompt = task.doc_to_text(doc)
        for line in {line.strip() for line in str(prompt).splitlines() if line.strip()}:
            counts[line] = counts.get(line, 0) + 1
    return frozenset(line for line, n in counts.items() if n > len(docs) / 2)


def _plain(value: Any) -> Any:
    """JSON-ready: tuples and numpy scalars from lm-eval's samples made lists and numbers."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def _as_lm_eval_value(value: Any) -> Any:
    """A per-sample value back as lm-eval's aggregation takes it (F1's (gold, pred) pairs)."""
    return tuple(value) if isinstance(value, list) else value
