"""Your own eval task without code: a task file (TOML or YAML) and a JSONL of items.

    # exam.toml                               # exam.jsonl, one item a line
    name = "my_exam"                          {"context": "...", "choices": ["...", "..."],
    kind = "multiple_choice"                   "gold": 1}      (gold: an index or the text)
    items = "exam.jsonl"
    fewshot_items = "exam-dev.jsonl"          # kind = "generation":
    num_fewshot = 3                           {"prompt": "...", "answer": "..."}
    fewshot_seed = 1234

Multiple choice is scored by log-likelihood of each choice after the context (acc, and acc_norm:
divided by the choice's length in bytes), generation by exact match of the greedy answer after
the stated `normalise` steps (strip, lowercase, no_punctuation, no_spaces), on the first match of
`answer_regex` when one is given. Few-shot examples come from `fewshot_items` with `fewshot_seed`.

The file becomes an lm-evaluation-harness task config (the YAML an lm-eval user would write,
`lm_eval_config`), so it is scored, few-shot and all, exactly as lm-eval would score that YAML,
and its items are decontaminated like any of lm-eval's. Item ids: the item's position among the
file's items (lm-eval's doc_id), the same in the eval and in the decontamination report.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from hanlm.errors import UserError
from hanlm.evals.tasks.base import TASK_FILE_SUFFIXES
from hanlm.evals.tasks.lm_eval_registry import LmEvalTask, build_from_config

NORMALISE = {  # step -> lm-eval exact_match argument
    "strip": ("regexes_to_ignore", r"^\s+|\s+$"),
    "no_spaces": ("regexes_to_ignore", r"\s+"),
    "lowercase": ("ignore_case", True),
    "no_punctuation": ("ignore_punctuation", True),
}


class TaskFile(BaseModel):
    """What a task file says (unknown keys are refused: a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*$")
    kind: Literal["multiple_choice", "generation"]
    items: str
    fewshot_items: str | None = None
    num_fewshot: int = Field(0, ge=0, le=32)
    fewshot_seed: int = 1234
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    description: str = ""  # text put before every prompt (lm-eval's `description`)
    # generation only
    normalise: list[Literal["strip", "no_spaces", "lowercase", "no_punctuation"]] = ["strip"]
    answer_regex: str | None = None
    until: list[str] = ["\n\n"]
    max_new_tokens: int = Field(256, ge=1)


def is_task_file(spec: str) -> bool:
    return spec.lower().endswith(TASK_FILE_SUFFIXES)


def read(path: str | Path) -> tuple[TaskFile, Path, Path | None]:
    """The task file's settings and its items' files (checked line by line), or a UserError
    naming the file, line and field."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(
            f"task file {path} does not exist",
            fix="give a .toml or .yaml task file (see `hanlm eval --help`)",
        )
    raw = _parse(path)
    if not isinstance(raw, dict):
        raise UserError(f"task file {path} holds {type(raw).__name__}, not a table of settings")
    raw.setdefault("name", path.stem)
    try:
        task = TaskFile.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "(the file)"
        raise UserError(
            f"task file setting {field}: {first['msg']}",
            where=str(path),
            fix=_fix_for(first, field),
        ) from None
    if task.kind == "multiple_choice" and task.answer_regex is not None:
        raise UserError(
            "answer_regex is for generation tasks",
            where=f"{path}: answer_regex",
            fix="remove it, or set kind = 'generation'",
        )
    if task.answer_regex is not None:
        try:
            re.compile(task.answer_regex)
        except re.error as e:
            raise UserError(
                f"answer_regex is not a regular expression: {e}",
                where=f"{path}: answer_regex",
                fix="write a Python regular expression; its first group (or the whole match) "
                "is the answer",
            ) from None
    items = _check_items(path.parent / task.items, task.kind, path, "items")
    fewshot = None
    if task.fewshot_items is not None:
        fewshot = _check_items(path.parent / task.fewshot_items, task.kind, path, "fewshot_items")
    elif task.num_fewshot:
        raise UserError(
            f"num_fewshot = {task.num_fewshot} but no fewshot_items to take examples from",
            where=str(path),
            fix="add fewshot_items = 'FILE.jsonl' (items in the same form), or num_fewshot = 0",
        )
    return task, items, fewshot


def _parse(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"task file is not valid TOML: {e}", where=str(path)) from None
    import yaml  # deferred: only for YAML task files (transformers and datasets bring it)

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise UserError(f"task file is not valid YAML: {e}", where=where) from None


def _fix_for(error: dict, field: str) -> str:
    if error["type"] == "extra_forbidden":
        return f"remove {field}; the settings are {', '.join(TaskFile.model_fields)}"
    if error["type"] == "missing":
        return f"add {field}"
    if field == "kind":
        return "kind = 'multiple_choice' or kind = 'generation'"
    return "see the task file settings in `hanlm eval --help`"


def _check_items(path: Path, kind: str, task_path: Path, setting: str) -> Path:
    """Every line a JSON object with the fields its kind needs; ids, when given, distinct."""
    if not path.is_file():
        raise UserError(
            f"{setting} file {path} does not exist",
            where=f"{task_path}: {setting}",
            fix="give the JSONL file's path relative to the task file",
        )
    count = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                item = json.loads(line)
            except ValueError as e:
                raise UserError(f"not a JSON object: {e}", where=where) from None
            if not isinstance(item, dict):
                raise UserError(f"an item is a JSON object, not {type(item).__name__}", where=where)
            _check_item(item, kind, where)
            count += 1
    if not count:
        raise UserError(f"no items in {path}", where=f"{task_path}: {setting}")
    return path


def _check_item(item: dict, kind: str, where: str) -> None:
    def need_text(field: str) -> str:
        value = item.get(field)
        if not isinstance(value, str) or not value.strip():
            found = "missing" if field not in item else f"{type(value).__name__} {value!r}"
            raise UserError(
                f"{field} must be non-empty text, found {found}", where=f"{where}: {field}"
            )
        return value

    if kind == "generation":
        need_text("prompt")
        need_text("answer")
        return
    need_text("context")
    choices = item.get("choices")
    if (
        not isinstance(choices, list)
        or len(choices) < 2
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise UserError(
            "choices must be a list of at least two non-empty texts",
            where=f"{where}: choices",
        )
    gold = item.get("gold")
    if isinstance(gold, bool) or not (
        (isinstance(gold, int) and 0 <= gold < len(choices))
        or (isinstance(gold, str) and gold in choices)
    ):
        raise UserError(
            f"gold must be the right choice's index (0 to {len(choices) - 1}) or its text, "
            f"found {gold!r}",
            where=f"{where}: gold",
        )


def lm_eval_config(task: TaskFile, items: Path, fewshot: Path | None) -> dict:
    """The lm-evaluation-harness task config this file stands for."""
    files = {"test": str(items)}
    if fewshot is not None:
        files["train"] = str(fewshot)
    config: dict[str, Any] = {
        "task": task.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": files},
        "test_split": "test",
        "num_fewshot": task.num_fewshot,
        "target_delimiter": task.target_delimiter,
        "fewshot_delimiter": task.fewshot_delimiter,
        "description": task.description,
        "metadata": {"version": 1.0, "task_file": True},
    }
    if fewshot is not None:
        config["fewshot_split"] = "train"
    if task.kind == "multiple_choice":
        return {
            **config,
            "output_type": "multiple_choice",
            "doc_to_text": "{{context}}",
            "doc_to_choice": "choices",
            "doc_to_target": "gold",
            "metric_list": [
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        }
    match: dict[str, Any] = {"metric": "exact_match", "aggregation": "mean"}
    match["higher_is_better"] = True
    ignored = []
    for step in task.normalise:
        key, value = NORMALISE[step]
        if key == "regexes_to_ignore":
            ignored.append(value)
        else:
            match[key] = value
    if ignored:
        match["regexes_to_ignore"] = ignored
    config |= {
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {
            "until": task.until,
            "max_gen_toks": task.max_new_tokens,
            "do_sample": False,
        },
        "metric_list": [match],
    }
    if task.answer_regex is not None:
        config["filter_list"] = [
            {
                "name": "answer",
                "filter": [
                    {"function": "regex", "regex_pattern": task.answer_regex},
                    {"function": "take_first"},
                ],
            }
        ]
    return config


class FileTask(LmEvalTask):
    """A task file's task: lm-eval's task built from `lm_eval_config`, scored like any other."""

    where_to_get = "the task file and its items"

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.settings, self.items_file, self.fewshot_file = read(self.path)
        super().__init__(self.settings.name)

    def default_source(self, demo_files) -> str | None:
        return str(self.items_file)

    def _build(self, source, options):
        config = lm_eval_config(self.settings, self.items_file, self.fewshot_file)
        if options.num_fewshot:
            config["num_fewshot"] = options.num_fewshot
        task = build_from_config(config, where=str(self.path))
        task.set_fewshot_seed(self.settings.fewshot_seed)
        return task
