"""The preflight stage: measure the hosts and say GO or NO-GO into
`RUN/preflight/preflight.json` (see hanlm.preflight). A GO for the same settings, host and
number of ranks is reused; a NO-GO is never marked finished, so the next run measures again."""

from __future__ import annotations

import socket
from pathlib import Path

from hanlm import ranks
from hanlm.config import Config
from hanlm.console import warn
from hanlm.preflight import run as preflight
from hanlm.preflight.report import PreflightReport
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext, Unfinished


def checkpoint_folder(cfg: Config, run: RunDir | Path, override: str | Path | None = None) -> Path:
    """Where training will save checkpoints: --checkpoint-dir, preflight.checkpoint_dir, or the
    run's pretraining checkpoints."""
    chosen = override or cfg.preflight.checkpoint_dir
    return Path(chosen) if chosen else RunDir.of(run).pretrain.checkpoints


def check(
    cfg: Config, run: RunDir | Path, *, checkpoint_dir: str | Path | None = None
) -> PreflightReport:
    """Measure, judge, write the report (rank 0) and print the table; every rank gets the whole
    report (`hanlm preflight`, outside the pipeline)."""
    run = RunDir.of(run)
    return preflight.check(
        cfg,
        folder=checkpoint_folder(cfg, run, checkpoint_dir),
        shards_dir=run.shards,
        report_path=run.preflight,
    )


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> list:
    """A GO holds for this host, this many ranks and this checkpoint folder."""
    world = str(ranks.world_size())
    return [socket.gethostname(), world, str(checkpoint_folder(cfg, run))]


def build(ctx: StageContext) -> PreflightReport | Unfinished:
    """The report when GO; NO-GO stops the pipeline (a UserError) unless
    preflight.fail_on_no_go is false, and is then never marked finished (Unfinished)."""
    report = preflight.check(
        ctx.cfg,
        folder=checkpoint_folder(ctx.cfg, ctx.run),
        shards_dir=ctx.run.shards,
        report_path=ctx.out / PreflightReport.FILE,
        # in a pipeline, before the data stages: they make the shards next
        without_shards="the run makes them after this check; `hanlm preflight` with the same "
        "run folder measures loading them once they are there",
    )
    if report.go:
        return report
    if ctx.cfg.preflight.fail_on_no_go:
        raise preflight.no_go_error(report, ctx.out / PreflightReport.FILE)
    warn("preflight: NO-GO, going on as preflight.fail_on_no_go = false")
    return Unfinished(report)


STAGE = Stage(
    name="preflight",
    version=1,
    output=lambda run: run.preflight.parent,
    result=PreflightReport,
    reads=(
        "preflight",
        "pretrain",
        "checkpoint",
        "model",
        "precision",
        "parallel",
        "plan",
        "data_engine",
        "tokenizer.vocab_size",
        "tokenizer.extend",  # continued pretraining: the model's rows and the ones added
        "optimizer.name",  # the step's state: Muon's is smaller than AdamW's
        "logging",
        "run.seed",
    ),
    writes="in_place",
    all_ranks=True,
    build=build,
    inputs=inputs,
)
