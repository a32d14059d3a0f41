"""The report stage: the report card `RUN/report.md` with its figures in `RUN/plots/`
(see hanlm.report.card)."""

from __future__ import annotations

from hanlm.console import info
from hanlm.files import atomic_write_text
from hanlm.report import card
from hanlm.report.run_files import RunFiles
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import Stage, StageContext


# Rebuilt every time: it only reads, and the stages before it may have changed.
def run_files(run: RunDir) -> RunFiles:
    """Where the report finds what each stage wrote in the run."""
    return RunFiles(
        name=run.root.name,
        root=run.root,
        plots=run.plots,
        config=run.config,
        plan=run.plan,
        preflight=run.preflight,
        corpus_stats=run.corpus_stats,
        decontam_report=run.decontam_report,
        decontam_items=run.decontam_items,
        planted=run.demo_file("planted"),
        pretrain_metrics=run.pretrain.metrics,
        pretrain_summary=run.pretrain.summary,
        sft_metrics=run.sft.metrics,
        closure=run.sft.closure,
        sft_summary=run.sft.summary,
        ablation_closure=lambda variant: run.sft.ablation(variant).closure,
        audit=run.sft.audit,
        eval_results=run.eval_results,
        eval_samples=run.eval_samples,
        export_folder=run.pretrain.export.name,
        compare_eval_samples=run.comparison("drop").eval_samples,
        launch=run.launch / "launch.json",
        rehearsal=run.rehearsal_record,
    )


def build(ctx: StageContext) -> dict:
    run = ctx.run
    text = card.build(run_files(run))
    atomic_write_text(run.report, text)
    plots = sorted(path.name for path in run.plots.glob("*.png"))
    info(f"report: {run.report} with {len(plots)} plots in {run.plots}")
    return {"report": str(run.report), "plots": plots}


STAGE = Stage(
    name="report",
    version=1,
    output=lambda run: run.root,
    result=None,
    writes="always",
    build=build,
)
