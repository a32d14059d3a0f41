"""`hanlm eval`: run tasks on one or more models and write results.json, samples.jsonl and
results.md, every score split into full / clean / dirty when a decontamination report exists.

`run_evaluation(...)` evaluates model folders: the `eval` stage (hanlm.stages.eval) with a
run's own models (its pretraining and SFT exports, side by side) and `write_results` into its
folder; `evaluate(...)`, the CLI's --model/--out mode, with any, into a folder of the user's.

results.json: {"models": [...], "tasks": {task: {"benchmark", "source", "items"}},
"contamination": path or null, "results": {model: {task: {split: {metric: {value, stderr, n}}}}},
"counts": {model: {task: {split: items}}}}.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.errors import UserError
from hanlm.evals import contamination as contamination_lib
from hanlm.evals import tasks as tasks_lib
from hanlm.evals.harness import Model, require_model_folder
from hanlm.evals.results import EvalResults
from hanlm.files import atomic_output_dir, atomic_write_text, claim_output_dir, fingerprint

RESULTS_FILE = EvalResults.FILE


def options_from(cfg: Config) -> tasks_lib.Options:
    eval_cfg = cfg.eval
    return tasks_lib.Options(
        limit=eval_cfg.limit,
        num_fewshot=eval_cfg.num_fewshot,
        max_new_tokens=eval_cfg.max_new_tokens,
        distractors=eval_cfg.distractors,
        chat_template=eval_cfg.chat_template,
        seed=cfg.run.seed,
        extra={"generate": cfg.generate.model_dump()},  # the repetition task's penalties
    )


def load_tasks(
    specs: Sequence[str], demo_files: Mapping[str, Path] | None, options: tasks_lib.Options
) -> tuple[list[tuple[tasks_lib.Task, str | None, list]], list]:
    """Every task with its items (limited), read before any model loads so bad data fails fast,
    and the groups they were named by (lm-eval's `kmmlu`, `haerae`, ...).

    `demo_files` (the demo world's files by kind, in a run) give tasks named without a path
    their default data."""
    if not tasks_lib.split_specs(specs):
        raise UserError(
            "no eval task given", fix=f"add --tasks NAME, one of {', '.join(tasks_lib.names())}"
        )
    leaves, groups = tasks_lib.expand_specs(specs)
    loaded = []
    for spec in leaves:
        name, source = tasks_lib.parse_task_spec(spec)
        task = tasks_lib.get(name)
        items = task.load(source, demo_files=demo_files, options=options)
        if options.limit is not None:
            items = items[: options.limit]
        loaded.append((task, source or task.default_source(demo_files), items))
    return loaded, groups


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation found: results.json's record and every scored sample."""

    record: EvalResults
    samples: list[dict]


def run_evaluation(
    models: Sequence[str | Path],
    task_specs: Sequence[str],
    *,
    demo_files: Mapping[str, Path] | None = None,
    contamination: str | Path | None = None,
    options: tasks_lib.Options | None = None,
    batch_size: int = 32,
    dtype: str = "fp32",
    device: str = "auto",
) -> Evaluation:
    """Evaluate each model on each task, every score split by the contamination report."""
    options = options or tasks_lib.Options()
    if not models:
        raise UserError("no model to evaluate", fix="give --model DIR (repeatable) or --run DIR")
    model_dirs = [require_model_folder(m) for m in models]
    loaded, groups = load_tasks(task_specs, demo_files, options)
    report = Path(contamination) if contamination else None
    statuses = contamination_lib.load_statuses(report) if report else None
    names = _model_names(model_dirs)
    results: dict[str, dict] = {}
    counts: dict[str, dict] = {}
    all_samples: list[dict] = []
    started = time.perf_counter()
    for name, model_dir in zip(names, model_dirs, strict=True):
        model = Model(model_dir, device=device, dtype=dtype, batch_size=batch_size)
        results[name], counts[name] = {}, {}
        for task, _, items in loaded:
            t0 = time.perf_counter()
            samples = task.evaluate(model, items, options)
            splits, split_counts = contamination_lib.split_samples(
                samples, task.benchmark, statuses
            )
            results[name][task.name] = {
                split: task.aggregate(rows) for split, rows in splits.items()
            }
            counts[name][task.name] = split_counts
            for s in samples:
                all_samples.append({"model": name, "task": task.name, **s})
            info(
                f"eval: {name} {task.name}: {_headline(results[name][task.name])} "
                f"({len(items)} items, {time.perf_counter() - t0:.1f}s)"
            )
        for group in groups:  # innermost first: a group's member groups are done before it
            results[name][group.name] = _group_scores(group, results[name])
            info(f"eval: {name} {group.name}: {_headline(results[name][group.name])}")
        del model
    record = {
        "models": names,
        "model_dirs": {n: str(d) for n, d in zip(names, model_dirs, strict=True)},
        "tasks": {
            task.name: {"benchmark": task.benchmark, "source": source, "items": len(items)}
            for task, source, items in loaded
        },
        "groups": {group.name: list(group.members) for group in groups},
        "contamination": str(report) if report else None,
        "contamination_splits": contamination_lib.__doc__.split("\n\n")[1].replace("\n", " ")
        if statuses
        else None,
        "results": results,
        "counts": counts,
        "seconds": round(time.perf_counter() - started, 3),
    }
    # what the results are of: also what marks a folder of results as hanlm's (--out --force)
    record["fingerprint"] = fingerprint({k: v for k, v in record.items() if k != "seconds"})
    return Evaluation(EvalResults.model_validate(record), all_samples)


def _group_scores(group, results: Mapping[str, dict]) -> dict:
    """A group's scores on each split, from its members' (lm-eval's aggregate_metric_list)."""
    # deferred: lm-eval is optional (groups exist only where it is installed)
    from hanlm.evals.tasks.lm_eval_registry import aggregate_group

    members = [results[m] for m in group.members]
    splits = [s for s in members[0] if all(s in m for m in members)] if members else []
    return {split: aggregate_group(group, [m[split] for m in members]) for split in splits}


def write_results(folder: Path, evaluation: Evaluation) -> None:
    """results.json, samples.jsonl and results.md into `folder`."""
    _write_outputs(Path(folder), evaluation.record, evaluation.samples)


def evaluate(
    models: Sequence[str | Path],
    task_specs: Sequence[str],
    out: Path,
    *,
    replace_earlier: bool = True,
    **settings,
) -> EvalResults:
    """`hanlm eval --out OUT`: evaluate into OUT (results.json, samples.jsonl, results.md);
    `settings` as `run_evaluation` takes them. `out` must be new, empty or an earlier
    evaluation's folder (replaced only with `replace_earlier`): checked before any model loads.
    """
    claim_output_dir(out, marker=RESULTS_FILE, replace_earlier=replace_earlier)
    evaluation = run_evaluation(models, task_specs, **settings)
    with atomic_output_dir(Path(out), marker=RESULTS_FILE, replace_earlier=replace_earlier) as tmp:
        write_results(tmp, evaluation)
    info(f"eval: results in {out}")
    return evaluation.record


def _model_names(dirs: Sequence[Path]) -> list[str]:
    names = []
    for d in dirs:
        # an export folder is called hf: name it after its run and stage instead
        name = f"{d.parent.parent.name}/{d.parent.name}" if d.name == "hf" else d.name
        base, i = name, 2
        while name in names:
            name, i = f"{base}#{i}", i + 1
        names.append(name)
    return names


def _headline(splits: dict) -> str:
    full = splits.get("full", {})
    parts = []
    for metric, m in list(full.items())[:3]:
        if m["value"] is not None:
            parts.append(f"{metric}={m['value']:.4f}")
    return " ".join(parts)


def _write_outputs(out: Path, record: EvalResults, samples: list[dict]) -> None:
    record.write(out / RESULTS_FILE)
    lines = "".join(json.dumps(s, ensure_ascii=False, default=str) + "\n" for s in samples)
    atomic_write_text(out / "samples.jsonl", lines)
    atomic_write_text(out / "results.md", results_markdown(record.to_json()))
    for model in record.models:
        folder = out / LM_EVAL_FOLDER / _sanitized(model)
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(lm_eval_shape(record, model), ensure_ascii=False, indent=2)
        atomic_write_text(folder / "results.json", text + "\n")


LM_EVAL_FOLDER = "lm-eval"  # OUT/lm-eval/<model>/results.json: what tools reading lm-eval read


def _sanitized(model: str) -> str:
    # lm-eval's own folder naming: a Hub id's "/" becomes "__"
    return model.replace("/", "__").replace("#", "_")


def lm_eval_shape(record: EvalResults, model: str) -> dict:
    """One model's scores in lm-evaluation-harness's results-file shape (the `full` split:
    lm-eval has no clean / dirty ones; those are in results.json)."""

    def entries(name: str) -> dict:
        row: dict = {"alias": name}
        for metric, score in record.results[model][name].get("full", {}).items():
            row[f"{metric},none"] = score.value
            row[f"{metric}_stderr,none"] = "N/A" if score.stderr is None else score.stderr
        return row

    counts = record.counts[model]
    return {
        "results": {task: entries(task) for task in record.tasks},
        "groups": {group: entries(group) for group in record.groups},
        "group_subtasks": {group: list(members) for group, members in record.groups.items()},
        "n-samples": {
            task: {"original": record.tasks[task].items, "effective": counts[task]["full"]}
            for task in record.tasks
        },
        "config": {
            "model": "hanlm",
            "model_args": f"pretrained={record.model_dirs[model]}",
            "contamination": record.contamination,
        },
        "model_name": model,
    }


def _cell(metric: dict | None) -> str:
    if not metric or metric.get("value") is None:
        return "–"
    text = f"{metric['value']:.4f}"
    if metric.get("stderr") is not None:
        text += f" ± {metric['stderr']:.4f}"
    return f"{text} (n={metric['n']})"


def results_markdown(record: dict) -> str:
    """One table: a row per task, split and metric; a column per model."""
    models = record["models"]
    lines = ["# Evaluation results", ""]
    if record.get("contamination"):
        lines += [
            f"Contamination report: `{record['contamination']}`. {record['contamination_splits']}",
            "",
        ]
    lines += ["| task | split | metric | " + " | ".join(models) + " |"]
    lines += ["|---|---|---|" + "---|" * len(models)]
    for task in [*record["tasks"], *record.get("groups", {})]:
        first = record["results"][models[0]][task]
        for split in first:
            for metric in first[split]:
                cells = [
                    _cell(record["results"][m][task].get(split, {}).get(metric)) for m in models
                ]
                lines.append(f"| {task} | {split} | {metric} | " + " | ".join(cells) + " |")
    counts = record["counts"][models[0]]
    unchecked = {t: c["unchecked"] for t, c in counts.items() if c.get("unchecked")}
    if unchecked:
        lines += [
            "",
            "Items not in the contamination report (in `full` only): "
            + ", ".join(f"{t}: {n}" for t, n in unchecked.items()),
        ]
    return "\n".join(lines) + "\n"
