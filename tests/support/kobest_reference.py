"""The reference side of the KoBEST conformance checks, shared by the tests and
`benchmarks/eval.py`: skt/kobest_v1 rebuilt from the TSV release the way its publisher's loading
script (kobest_v1.py) built it, and lm-evaluation-harness's own kobest tasks reading a local copy.
pandas, datasets and lm-eval are dev-only dependencies, imported when used."""

from __future__ import annotations

from pathlib import Path


def _false_is_zero(values) -> list[int]:
    return [0 if str(v) == "False" else 1 for v in values]


# How the loading script built each task's row from the TSV's columns.
PUBLISHED_COLUMNS = {
    "kobest_boolq": lambda df: {
        "paragraph": df["Text"], "question": df["Question"], "label": _false_is_zero(df["Answer"])
    },
    "kobest_copa": lambda df: {
        "premise": df["sentence"], "question": df["question"], "alternative_1": df["1"],
        "alternative_2": df["2"], "label": df["Answer"] - 1,
    },
    "kobest_hellaswag": lambda df: {
        "context": df["context"], **{f"ending_{i}": df[f"choice{i}"] for i in range(1, 5)},
        "label": df["label"],
    },
    "kobest_sentineg": lambda df: {"sentence": df["Text"], "label": df["Label"]},
    "kobest_wic": lambda df: {
        "word": df["Target"], "context_1": df["SENTENCE1"], "context_2": df["SENTENCE2"],
        "label": _false_is_zero(df["ANSWER"]),
    },
}  # fmt: skip


def publish(tsv: Path, task: str):
    """skt/kobest_v1's split built from a KoBEST TSV the way its publisher built it, as a
    `datasets.Dataset`: pandas `read_csv(sep="\\t")` (CSV quoting and NA strings included),
    `dropna()` over every column, then the task's columns renamed and its label mapped. Built
    from the TSV, never from hanlm's items, so it checks hanlm's reader instead of echoing it."""
    import datasets
    import pandas as pd

    frame = pd.read_csv(tsv, sep="\t").dropna()
    published = pd.DataFrame(PUBLISHED_COLUMNS[task](frame)).reset_index(drop=True)
    return datasets.Dataset.from_pandas(published, preserve_index=False)


def kobest_task_manager():
    """lm-evaluation-harness's task index of its kobest folder alone (all of it takes ~1 min)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = Path(lm_eval.__file__).parent / "tasks" / "kobest"
    return TaskManager(include_path=str(folder), include_defaults=False)


def lm_eval_task(manager, name: str, path: Path):
    """The task's own YAML (prompts, choices, metrics) with its data read from a local file."""
    from lm_eval.api.task import ConfigurableTask

    overrides = {
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"validation": str(path)}},
        "training_split": None,
        "test_split": None,
        "validation_split": "validation",
    }
    config = manager._factory._load_full_config(manager._entry(name), overrides)
    for key in ("tag", "group", "task_list"):
        config.pop(key, None)
    return ConfigurableTask(config=config)
