"""The stages in order, and running them with skip-if-complete and `--from STAGE`."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from hanlm.config import Config, save_config
from hanlm.console import info
from hanlm.errors import UserError

# name -> module with `run(cfg, run_dir, *, force) -> dict`
STAGES: dict[str, str] = {
    "plan": "hanlm.plan",
    "preflight": "hanlm.preflight",
    "corpus": "hanlm.data.corpus",
    "decontam": "hanlm.data.decontam",
    "tokenizer": "hanlm.data.tokenizer",
    "shards": "hanlm.data.shards",
    "pretrain": "hanlm.train.pretrain",
    "export": "hanlm.train.export",
    "sft": "hanlm.train.sft",
    "eval": "hanlm.evals.run",
    "report": "hanlm.report",
}


def stage_module(name: str):
    if name not in STAGES:
        raise UserError(f"unknown stage {name!r}", fix=f"choose one of {', '.join(STAGES)}")
    return importlib.import_module(STAGES[name])


def run_stage(name: str, cfg: Config, run_dir: Path, *, force: bool = False) -> dict:
    result = stage_module(name).run(cfg, Path(run_dir), force=force)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one writer
        save_config(cfg, run_dir)
    return result


def run_pipeline(
    cfg: Config, run_dir: Path, *, from_stage: str | None = None, until: str | None = None
) -> dict[str, dict]:
    """Stages in order up to `until` (all by default); complete ones are skipped unless at or
    after `from_stage`."""
    names = list(STAGES)
    for name in (from_stage, until):
        if name is not None:
            stage_module(name)  # an unknown name is a UserError listing the stages
    start = names.index(from_stage) if from_stage else len(names)
    stop = names.index(until) + 1 if until else len(names)
    if stop <= start < len(names):
        raise UserError(f"--from {from_stage} comes after --until {until}", fix="swap them")
    results = {}
    for i, name in enumerate(names[:stop]):
        info(f"[bold]== {name}[/bold]")
        results[name] = run_stage(name, cfg, run_dir, force=i >= start)
    return results
