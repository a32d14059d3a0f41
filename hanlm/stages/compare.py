"""The compare stage: the same recipe trained without the contaminated documents, evaluated
beside the run's own model, so the report shows the scores before and after decontamination.

On when `decontam.compare_drop` is set and the run keeps its flagged documents
(`decontam.action = keep`, as the demo does to measure what they add). The comparison is a run
of its own in `RUN/compare/drop/`: it shares the run's demo world and corpus (linked, so the two
models read the same text up to the dropped documents), scans the corpus again with
`action = drop`, and has its own tokenizer, shards, pretraining, export and eval of the benchmark
tasks. The tokenizer is its own because a run that drops the documents trains its tokenizer
without them: one trained on the leaked copies merges their answers into fewer tokens (the demo's
leaked capitals became single tokens), which favours those answers in any model that uses it.

The stage is the pipeline run again (Stage.rerun): each of its stages is skipped when finished,
as the run's own are.
"""

from __future__ import annotations

import os
from pathlib import Path

from hanlm.config import Config
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import Rerun, Stage

ACTION = "drop"
SHARED = ("demo", "corpus")  # the run's folders the comparison reads as its own


def not_needed(cfg: Config) -> str | None:
    """Why the comparison does not run for `cfg`, or None when it does."""
    decontam = cfg.decontam
    if not decontam.compare_drop:
        return "off (decontam.compare_drop = false)"
    if not decontam.enabled or not decontam.benchmarks:
        return "nothing to compare: decontamination is off"
    if decontam.action != "keep":
        return f"nothing to compare: the run itself trains on the corpus after `{decontam.action}`"
    return None


def comparison_config(cfg: Config) -> Config:
    """The run's recipe with the flagged documents dropped, evaluated on the benchmark tasks
    (the tasks whose scores decontamination splits) of its own model."""
    scored = [
        spec
        for spec in tasks_lib.split_specs(cfg.eval.tasks)
        if any(
            tasks_lib.get(tasks_lib.parse_task_spec(leaf)[0]).benchmark is not None
            for leaf in tasks_lib.expand_specs([spec])[0]
        )
    ]
    if not scored:
        raise UserError(
            "decontam.compare_drop needs a benchmark task in eval.tasks to compare",
            fix="add the decontaminated benchmark's task (e.g. demo_qa) to eval.tasks, or set "
            "decontam.compare_drop = false",
        )
    return cfg.model_copy(
        update={
            "decontam": cfg.decontam.model_copy(update={"action": ACTION, "compare_drop": False}),
            "eval": cfg.eval.model_copy(update={"tasks": scored, "models": []}),
        },
        deep=True,
    )


def _link_shared(run: RunDir, sub: RunDir) -> None:
    """The comparison's demo and corpus folders: links to the run's (relative, so the run folder
    can move)."""
    sub.root.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        source, link = run.stage(name), sub.stage(name)
        if not source.is_dir():
            raise UserError(
                f"the comparison needs the run's {name} folder, and {source} is missing",
                fix=f"run `hanlm run --run {run.root}` (the stages before it write it)",
            )
        target = Path(os.path.relpath(source, link.parent))
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            raise UserError(
                f"{link} is a folder, where the comparison links the run's {name}",
                fix=f"remove {link} (the comparison's own files are rebuilt)",
            )
        link.symlink_to(target, target_is_directory=True)


def derived(cfg: Config, run: RunDir) -> tuple[Config, RunDir]:
    """The recipe the comparison runs, and its run folder."""
    return comparison_config(cfg), run.comparison(ACTION)


def prepare(run: RunDir, sub: RunDir) -> None:
    """Before its stages run (rank 0): the comparison's links to the run's shared folders."""
    _link_shared(run, sub)


def describe(sub: RunDir) -> str:
    return f"the same recipe with decontam.action = {ACTION} in {sub.root}"


STAGE = Stage(
    name="compare",
    version=1,
    output=lambda run: run.comparison(ACTION).root,
    result=None,
    reads=("decontam", "eval"),
    rerun=Rerun(
        derive=derived,
        stages=("decontam", "tokenizer", "shards", "pretrain", "export", "eval"),
        prepare=prepare,
        describe=describe,
    ),
    not_needed=not_needed,
)
