"""The rehearsal on the report card and the terminal: each stage's status, seconds and figures,
the full run projected from what was measured beside the plan, and the verdict."""

from __future__ import annotations

from pathlib import Path

from hanlm.plan.measured import RehearsalRecord, StageRehearsal
from hanlm.report.markdown import table, usd


def stage_line(stage: StageRehearsal) -> str:
    """A stage's own figures in a few words (its error when it failed or did not run)."""
    f = stage.figures
    if stage.status != "ok":
        return stage.error or ""
    parts: list[str] = []
    if "mb_per_s_per_core" in f:
        parts.append(f"{f['mb_per_s_per_core']:,.2f} MB/s per core ({f['mb']:,.1f} MB)")
    if "tokens_per_s" in f:
        parts.append(f"{f['tokens_per_s']:,.0f} tokens/s")
    if f.get("mfu") is not None:
        parts.append(f"MFU {f['mfu']:.1%}")
    if "peak_memory_gb" in f:
        planned = f.get("planned_memory_gb")
        parts.append(
            f"peak {f['peak_memory_gb']:.2f} GB"
            + (f" (plan {planned:.2f} GB)" if planned is not None else "")
        )
    if "checkpoint_write_s" in f:
        parts.append(f"checkpoint written in {f['checkpoint_write_s']:.2f} s")
    if "steps_compared" in f:
        load = f" (loaded in {f['load_s']:.2f} s)" if f.get("load_s") is not None else ""
        parts.append(
            f"stopped while saving step {f['stopped_in_save_of_step']}, resumed from step "
            f"{f['resumed_from_step']}{load}; "
            f"{f['steps_compared']} steps agree {f['promise']}"
        )
    if "items_per_s" in f:
        parts.append(f"{f['items']:,} items, {f['items_per_s']:,.2f} items/s")
    if "answer_s" in f:
        parts.append(f"listening in {f['listen_s']:.1f} s, answered in {f['answer_s']:.2f} s")
    if "planned_tokens_per_s" in f and "tokens_per_s" not in f:
        parts.append(f"planned {f['planned_tokens_per_s']:,.0f} tokens/s")
    if "place" in f:
        parts.append(f"last checkpoint in {f['place']}")
    return "; ".join(parts)


def projection_lines(record: RehearsalRecord) -> list[str]:
    """The full run at the measured speed beside the plan's, and the verdict's reason."""
    p = record.projection
    if p is None:
        return []
    lines = [
        f"pretraining {p.tokens / 1e9:,.3g}B tokens at the measured {p.measured_tokens_per_s:,.0f} "
        f"tokens/s on {p.gpus} device(s): {p.pretrain_hours:,.2f} h, {p.gpu_hours:,.2f} "
        f"GPU-hours, {usd(p.usd)}"
        + (
            f" (plan: {p.planned_tokens_per_s:,.0f} tokens/s, {p.planned_gpu_hours:,.2f} "
            f"GPU-hours, {usd(p.planned_usd)})"
            if p.planned_tokens_per_s is not None and p.planned_gpu_hours is not None
            else ""
        )
    ]
    if p.data_hours is not None:
        lines.append(
            f"data stages at the measured MB/s per core: {p.data_hours:,.2f} h (plan: "
            f"{p.planned_data_hours:,.2f} h); total {p.total_hours:,.2f} h"
            + (f" (plan: {p.planned_total_hours:,.2f} h)" if p.planned_total_hours else "")
        )
    return lines


def rehearsal_part(path: Path | None) -> str:
    """The card's part for the run's rehearsal, when one was made ('' otherwise)."""
    record = RehearsalRecord.read_if_present(path) if path is not None else None
    if record is None:
        return ""
    out = [
        f"\n**Rehearsal** (`hanlm rehearse`, {record.created_at[:16].replace('T', ' ')} UTC, "
        f"{record.world_size} x {record.device}): **{record.verdict}**"
        + (
            f": {record.failed_stage} failed ({record.error}); fix: {record.fix}"
            if not record.ready
            else ""
        )
        + ".\n\n"
    ]
    rows = [
        [s.name, s.status, f"{s.seconds:,.1f}" if s.seconds is not None else "", stage_line(s)]
        for s in record.stages
    ]
    out.append(table(["stage", "status", "seconds", "measured"], rows))
    for line in projection_lines(record):
        out.append(f"\n{line[0].upper() + line[1:]}.\n")
    if record.tuned:
        out.append(f"\nTuned: {record.tuned['set']} ({record.tuned['why']}).\n")
    return "".join(out)
