"""`hanlm publish RUN`: the run's chat (else base) export with a model card built from the run,
written to RUN/publish/ (or --out) and uploaded to the Hugging Face Hub (hanlm.share.publish).
Not a pipeline stage: it sends the run's results elsewhere, and only when asked; the command's
own code, beside the parser."""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.errors import UserError
from hanlm.share import publish as publish_lib
from hanlm.stages.rundir import RunDir


def run_files(run: RunDir) -> publish_lib.RunFiles:
    """Where publishing finds what each stage wrote in the run."""
    root = run.root
    return publish_lib.RunFiles(
        name=root.resolve().name,
        exports={"chat": run.sft.export, "base": run.pretrain.export},
        eval_results=run.eval_results,
        decontam_report=run.decontam_report,
        plan=run.plan,
        preflight=run.preflight,
        pretrain_summary=run.pretrain.summary,
        pretrain_metrics=run.pretrain.metrics,
        sft_summary=run.sft.summary,
        report=run.report,
        plots=run.plots,
        fixes={
            "export": f"run `hanlm run --run {root}` to train and export it (or `hanlm export "
            f"--run {root}` after pretraining)",
            "chat": f"run `hanlm sft --run {root}` (or `hanlm run --run {root}`)",
            "eval": f"run `hanlm eval --run {root}` (or `hanlm run --run {root}`)",
        },
    )


def run(
    cfg: Config,
    run: RunDir | Path,
    *,
    repo: str | None,
    model: str | None = None,
    out: Path | None = None,
    dry_run: bool = False,
    gguf: Path | None = None,
    force: bool = False,
) -> dict:
    """Publish the run with `cfg`'s [publish] settings. The card describes the recipe of the
    run's own config.toml (none when the run saved none). A user-named --out is replaced only
    with --force."""
    run = RunDir.of(run)
    if not run.root.is_dir():
        raise UserError(
            f"run directory {run.root} does not exist",
            fix="give the folder `hanlm run --run DIR` trained in",
        )
    return publish_lib.publish(
        run_files(run),
        out=out if out is not None else run.publish,
        repo=repo,
        model=model,
        dry_run=dry_run,
        private=cfg.publish.private,
        license=cfg.publish.license,
        recipe=cfg if run.config.is_file() else None,
        gguf=gguf,
        replace_earlier=out is None or force,
    )
