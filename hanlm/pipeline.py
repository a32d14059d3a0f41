"""The stages in order, and running them with skip-if-complete and `--from STAGE`."""

from __future__ import annotations

import datetime
import importlib
import os
from pathlib import Path

from hanlm import run_lock
from hanlm.config import Config
from hanlm.console import info
from hanlm.errors import UserError
from hanlm.stages.rundir import save_run_config
from hanlm.train import trackers

# name -> module with `run(cfg, run, *, force) -> dict` (run: a RunDir or its path)
STAGES: dict[str, str] = {
    "plan": "hanlm.stages.plan",
    "preflight": "hanlm.stages.preflight",
    "corpus": "hanlm.stages.corpus",
    "decontam": "hanlm.stages.decontam",
    "tokenizer": "hanlm.stages.tokenizer",
    "shards": "hanlm.stages.shards",
    "pretrain": "hanlm.stages.pretrain",
    "export": "hanlm.stages.export",
    "sft": "hanlm.stages.sft",
    "eval": "hanlm.stages.eval",
    "compare": "hanlm.stages.compare",
    "report": "hanlm.stages.report",
}


def stage_module(name: str):
    if name not in STAGES:
        raise UserError(f"unknown stage {name!r}", fix=f"choose one of {', '.join(STAGES)}")
    return importlib.import_module(STAGES[name])


# Under torchrun these stages use every rank; the others run on rank 0 while the rest wait.
ALL_RANKS = frozenset({"preflight", "pretrain", "sft", "compare"})
WAIT_LIMIT = datetime.timedelta(days=7)  # a corpus stage on a large crawl takes hours


def _pipeline_store():
    """The key-value store torchrun's agent keeps for this launch: fresh for every launch and
    restart, so a waiting rank never mistakes an earlier run's signal for this one's."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        raise UserError(
            "hanlm run with several processes needs torchrun's agent store",
            fix="launch it with torchrun (e.g. torchrun --nproc_per_node 8 -m hanlm run "
            "--run-dir DIR), or run the stages one by one",
        )
    from torch.distributed import PrefixStore, TCPStore  # deferred: torch, only under torchrun

    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=WAIT_LIMIT,
    )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"hanlm-pipeline/{restart}", store)


def run_on_ranks(
    name: str, cfg: Config, run_dir: Path, *, force: bool = False, key: str | None = None
) -> dict:
    """Run a stage: on every rank if it trains or checks hosts, else on rank 0 alone; `key`
    names its signal to the waiting ranks when one launch runs the stage twice (default: the
    stage's name)."""
    key = key or name
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or name in ALL_RANKS:
        return run_stage(name, cfg, run_dir, force=force)
    store = _pipeline_store()
    if os.environ.get("RANK", "0") == "0":
        try:
            result = run_stage(name, cfg, run_dir, force=force)
        except BaseException as e:
            store.set(key, f"failed: {e}")
            raise
        store.set(key, "done")
        return result
    store.wait([key])
    status = store.get(key).decode()
    if status != "done":
        raise UserError(f"stage {name} failed on rank 0 ({status})", fix="see rank 0's output")
    return {"stage": name, "ran_on_rank": 0}


def run_stage(name: str, cfg: Config, run_dir: Path, *, force: bool = False) -> dict:
    # the comparison runs stages of its own, coordinated across ranks as the pipeline's are
    extra = {"run_stage": run_on_ranks} if name == "compare" else {}
    with run_lock.hold(run_dir):  # taken once per command; here for callers from Python
        result = stage_module(name).run(cfg, Path(run_dir), force=force, **extra)
        if os.environ.get("RANK", "0") == "0":  # under torchrun, one writer
            save_run_config(cfg, run_dir)
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
    if {"pretrain", "sft"} & set(names[:stop]):  # before hours of data stages, not after
        trackers.check(cfg.logging)
    results = {}
    with run_lock.hold(run_dir):  # no other command between two stages either
        for i, name in enumerate(names[:stop]):
            if os.environ.get("RANK", "0") == "0":
                info(f"[bold]== {name}[/bold]")
            results[name] = run_on_ranks(name, cfg, run_dir, force=i >= start)
    return results
