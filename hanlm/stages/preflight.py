"""The preflight stage: measure the hosts and say GO or NO-GO into `RUN/preflight.json`
(see hanlm.preflight)."""

from __future__ import annotations

from pathlib import Path

from hanlm import preflight
from hanlm.config import Config
from hanlm.console import info
from hanlm.files import read_json
from hanlm.stages.rundir import RunDir


def checkpoint_folder(cfg: Config, run: RunDir | Path, override: str | Path | None = None) -> Path:
    """Where training will save checkpoints: --checkpoint-dir, preflight.checkpoint_dir, or the
    run's pretraining checkpoints."""
    chosen = override or cfg.preflight.checkpoint_dir
    return Path(chosen) if chosen else RunDir.of(run).pretrain.checkpoints


def check(cfg: Config, run: RunDir | Path, *, checkpoint_dir: str | Path | None = None) -> dict:
    """Measure, judge, write RUN/preflight.json (rank 0) and print the table; every rank gets
    the whole report."""
    run = RunDir.of(run)
    return preflight.check(
        cfg,
        folder=checkpoint_folder(cfg, run, checkpoint_dir),
        shards_dir=run.shards,
        report_path=run.preflight,
    )


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict:
    """The pipeline stage: a GO report for the same settings and host is reused; NO-GO stops the
    pipeline unless preflight.fail_on_no_go is false."""
    run = RunDir.of(run)
    path = run.preflight
    folder = checkpoint_folder(cfg, run)
    if not force and path.is_file():
        try:
            previous = read_json(path)
        except (OSError, ValueError):
            previous = {}
        same = previous.get("fingerprint") == preflight.report_fingerprint(cfg, folder)
        if same and previous.get("verdict") == "GO":
            info(f"preflight: GO on {previous.get('created_at')} for these settings, skipped")
            return previous
    report = check(cfg, run)
    if report["verdict"] != "GO" and cfg.preflight.fail_on_no_go:
        raise preflight.no_go_error(report, path)
    return report
