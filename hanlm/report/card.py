"""`hanlm report`: the report card, a markdown text with its figures in a plots folder.

Every section sets one lesson of the field report (a 1.35B Korean model pretrained for ~240 USD
on 4-8 RTX 5090s) beside what this run measured. The report only reads what the stages wrote;
a stage that did not run is named as missing, never filled in. The report stage
(hanlm.stages.report) tells it where each file is (`RunFiles`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hanlm.config import load_config
from hanlm.data.corpus import CorpusStats
from hanlm.data.decontam.outputs import DecontamReport
from hanlm.evals.results import EvalResults
from hanlm.files import read_json, read_jsonl
from hanlm.launch.cost import LaunchRecord, spent
from hanlm.plan import estimate, inputs, memory_model, time_model
from hanlm.preflight.report import PreflightReport
from hanlm.train.results import PretrainSummary

GIB = 1 << 30

# The field report's own figures, quoted beside ours.
FIELD_BOOLQ = (1025, 1404)
FIELD_CLOSURE = {"none": (0, 50), "mean": (49, 50)}
FIELD_DIRECTION = {"forward": -1.42, "reverse": -3.23}
PLOTTED_REPETITION = ("seq_rep_2", "seq_rep_4", "rep_32")  # the table has them all


def _read(path: Path) -> Any | None:
    try:
        return read_json(path)
    except (OSError, json.JSONDecodeError):
        return None


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [row for row in read_jsonl(path) if isinstance(row, dict)]


def _missing(stage: str) -> str:
    return f"_Not measured: the `{stage}` stage has not run in this directory._\n"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass(frozen=True)
class RunFiles:
    """Every file the report reads and the folder its figures go to; a missing file is a
    stage that has not run."""

    name: str  # the report's title
    root: Path  # figure links are written relative to it
    plots: Path
    config: Path  # the run's config.toml: the decoding penalties of the repetition task
    plan: Path
    preflight: Path
    corpus_stats: Path
    decontam_report: Path
    decontam_items: Path
    planted: Path  # the demo world's planted benchmark items
    pretrain_metrics: Path
    pretrain_summary: Path
    sft_metrics: Path
    closure: Path
    closure_by_variant: Path
    ablation_closure: Callable[[str], Path]  # variant -> the closure.json of that compared SFT
    audit: Path
    eval_results: Path
    eval_samples: Path
    export_folder: str  # what a training stage names its Hugging Face export (".../pretrain/hf")
    # the samples.jsonl of the same recipe trained without the flagged documents (compare stage)
    compare_eval_samples: Path | None = None
    launch: Path | None = None  # `hanlm launch`'s launch.json, when the run was launched


def _heading(title: str, field_report: str) -> str:
    """A section's title and the field report's lesson it measures."""
    return f"## {title}\n\n> **Field report:** {field_report}\n\n"


# --- sections -----------------------------------------------------------------------------------


def _plan_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    out: list[str] = []
    field = inputs.FIELD_REPORT
    shapes = inputs.model_shapes(field.model, vocab_size=field.vocab_size, seq_len=field.seq_len)
    one = memory_model.memory(field, shapes)
    eight_setup = replace(field, gpus=8, parallel="fsdp")
    eight = memory_model.memory(eight_setup, shapes)
    timing = time_model.throughput(eight_setup, shapes)
    rows = [
        [item, f"{one['items'][item] / GIB:.2f}", f"{eight['items'][item] / GIB:.2f}"]
        for item in one["items"]
    ]
    rows.append(["**total**", f"**{one['total'] / GIB:.2f}**", f"**{eight['total'] / GIB:.2f}**"])
    rows.append(
        ["fits in 32 GB?", "no" if not one["fits"] else "yes", "yes" if eight["fits"] else "no"]
    )
    out.append(
        "**This planner on the field setup** (`1.3b`, seq 2,048, micro-batch 2, bf16, AdamW; "
        "GiB per GPU):\n\n"
    )
    out.append(_table(["item", "1 x RTX 5090", "8 x RTX 5090, FSDP"], rows))
    out.append(
        f"\n22B tokens on 8 RTX 5090s at 40% MFU, counting 6·N·D: **{timing['gpu_hours']:,.0f} "
        f"GPU-hours, {timing['wall_hours']:,.1f} h, {timing['cost']:,.0f} USD**; counting attention FLOPs "
        f"too adds {timing['attention_adds']:.0%} ({timing['cost_with_attention']:,.0f} USD).\n"
    )
    path = report_plots.memory_bars(
        {"1 x RTX 5090": one["items"], "8 x RTX 5090 (FSDP)": eight["items"]},
        one["capacity"],
        files.plots / "plan_memory.png",
    )
    out.append(f"\n![per-GPU memory of the field setup]({path.relative_to(files.root)})\n")

    plan = estimate.Plan.read_if_present(files.plan)
    if plan is None or plan.memory is None or plan.time is None:
        out.append("\n" + _missing("plan"))
        return "".join(out)
    mem, tt = plan.memory, plan.time
    setup = plan.setup
    out.append(
        f"\n**This run's plan** ({setup.model}, {plan.model.parameters:,} parameters, "
        f"on {setup.gpus} x {setup.gpu}): {mem.total / GIB:.2f} GiB per device of "
        f"{mem.capacity / GIB:.1f} ({'fits' if mem.fits else 'does not fit'}); "
        f"planned {tt.tokens_per_s:,.0f} tokens/s at MFU {tt.mfu:.0%} ({tt.mfu_source}).\n"
    )
    return "".join(out)


def _preflight_section(files: RunFiles) -> str:
    report = PreflightReport.read_if_present(files.preflight)
    if report is None:
        return _missing("preflight")
    out: list[str] = []
    out.append(
        f"**Verdict: {report.verdict}** ({report.world_size} process(es) on "
        f"{len(report.hosts)} host(s)).\n\n"
    )
    rank0 = report.ranks[0]
    rows = []
    for device in rank0.device_list():
        flops = device.get("matmul_flops")
        rows.append(
            [
                "device",
                f"{device.get('name')}: matmul {flops / 1e9:,.1f} GFLOP/s"
                if flops
                else device.get("name"),
            ]
        )
    storage = rank0.storage or {}
    if storage:
        rows.append(
            [
                "storage",
                f"write {storage.get('write_mb_s', 0):,.0f} MB/s with fsync, fsync "
                f"{storage.get('fsync_ms_median', 0):.1f} ms, read-back "
                f"{'ok' if storage.get('read_back_ok') else 'FAILED'}",
            ]
        )
    for finding in report.findings:
        rows.append([finding.check, f"{finding.severity}: {finding.reason}"])
    out.append(_table(["check", "measured"], rows))
    out.append(_launch_part(files))
    return "".join(out)


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} USD"


def _launch_part(files: RunFiles) -> str:
    """A launched run: every host set tried with its verdict and hours, and the cost planned
    before the launch against what the hosts cost."""
    record = LaunchRecord.read_if_present(files.launch) if files.launch else None
    if record is None:
        return ""
    c = record.cost
    paid = spent(
        files.preflight.parent,
        price_per_gpu_hour=c.price_per_gpu_hour,
        minutes_per_rejected_host=c.minutes_per_rejected_host,
    )
    out = [
        f"\n**Launched** with {record.engine} on {record.nodes} x {record.gpus_per_node} x "
        f"{record.accelerator or 'GPU'} ({c.market}, "
        f"{_usd(c.price_per_gpu_hour)} per GPU-hour: {c.price_source}).\n\n"
    ]
    rows = [
        [
            r["verdict"],
            ", ".join(r["hosts"]),
            r["gpus"],
            f"{r['gpu_hours']:,.2f}",
            "; ".join(r["reasons"]) or "-",
        ]
        for r in paid["host_sets"]
    ]
    if rows:
        out.append(_table(["verdict", "hosts", "GPUs", "GPU-hours paid", "why rejected"], rows))
    out.append(
        "\n"
        + _table(
            ["", "GPU-hours", "cost"],
            [
                [
                    "planned (training and data stages)",
                    f"{c.planned_gpu_hours:,.1f}",
                    _usd(c.planned_cost),
                ],
                [
                    "expected, with the allowances for rejected hosts and preemptions",
                    f"{c.expected_gpu_hours:,.1f}",
                    _usd(c.expected_cost),
                ],
                [
                    "spent so far (all host sets)",
                    f"{paid['gpu_hours']:,.2f}",
                    _usd(paid.get("cost")),
                ],
                [
                    "of which on rejected hosts",
                    f"{paid['rejected_gpu_hours']:,.2f}",
                    _usd(paid.get("rejected_cost")),
                ],
            ],
        )
    )
    out.append(
        "\nSpent: each host set from its start (its setup) to its verdict when rejected, or "
        "to the next set or now when accepted. Assumed for the plan: "
        + "; ".join(c.assumptions)
        + ".\n"
    )
    return "".join(out)


def _data_section(files: RunFiles) -> str:
    stats = CorpusStats.read_if_present(files.corpus_stats)
    if stats is None:
        return _missing("corpus")
    out: list[str] = []
    near = stats.near_duplicates
    out.append(
        f"Corpus: {stats.documents_in:,} documents in, {stats.documents_out:,} out "
        f"({stats.exact_duplicates:,} exact duplicates, "
        + (f"{near:,} near duplicates, " if near is not None else "no near-duplicate pass, ")
        + f"{stats.too_short:,} too short), {stats.characters_out:,} characters.\n\n"
    )
    if len(stats.sources) > 1:
        out.append(_sources_table(stats))
    out.append(_reads_lines(stats))
    summary = PretrainSummary.read_if_present(files.pretrain_summary)
    if summary is not None and summary.mixture:
        out.append(_mixture_table(summary.mixture))
    report = DecontamReport.read_if_present(files.decontam_report)
    if report is None:
        return "".join(out) + _missing("decontam")
    rows = [
        [
            name,
            f"{benchmark.items:,}",
            f"{benchmark.dirty:,} ({benchmark.dirty / max(benchmark.items, 1):.0%})",
            f"{benchmark.partial:,}",
            f"{benchmark.clean:,}",
        ]
        for name, benchmark in report.benchmarks.items()
    ]
    out.append(_table(["benchmark", "items", "dirty", "partial", "clean"], rows))
    on = f" on {', '.join(report.action_sources)} only" if report.action_sources else ""
    out.append(
        f"\nMatching: NFC, no spaces or punctuation, {report.ngram}-character n-grams; dirty at "
        f"coverage ≥ {report.dirty_threshold}, clean below {report.clean_threshold}. "
        f"Action on the corpus: **{report.action}**{on} "
        f"({report.documents_dropped or 0:,} documents dropped, "
        f"{report.documents_cut or 0:,} cut).\n"
    )
    if len(stats.sources) > 1:
        out.append(_contamination_by_source(report, list(stats.sources)))
    planted = _read(files.planted)
    if planted is not None:
        found = {
            record["item_id"]
            for record in _jsonl(files.decontam_items)
            if record["status"] == "dirty"
        }
        items = {item["item_id"] for item in planted}
        hit = len(items & found)
        out.append(
            f"\nThe demo world planted {len(items)} benchmark items into its documents, with their "
            f"answers, in {len(planted)} mirrored copies (verbatim, re-spaced, re-punctuated, "
            f"embedded); decontam marked {hit} of them dirty (an item whose every copy the corpus "
            f"stage's deduplication removed is no longer in the corpus).\n"
        )
    return "".join(out)


def _reads_lines(stats: CorpusStats) -> str:
    """How much of each source read only in part was read, and why (read = "needed" or N)."""
    lines = [
        f"- **{name}**: {read.tasks_read:,} of {read.tasks:,} tasks, {read.bytes_read / 1e9:,.2f} "
        f"of {read.bytes / 1e9:,.2f} GB ({stats.sources[name].characters_in:,} characters "
        f"read; {read.why}), drawn across its files in an order seeded by run.seed\n"
        for name, read in stats.reads.items()
        if not read.whole and name in stats.sources
    ]
    if not lines:
        return ""
    return (
        "Sources read as far as the mix needs (`read`, corpus.read_margin):\n\n"
        + "".join(lines)
        + "\n"
    )


def _sources_table(stats: CorpusStats) -> str:
    rows = []
    for name, source in stats.sources.items():
        kept = ", ".join(f"{n:,} by {other}" for other, n in source.duplicates_kept_by.items())
        rows.append(
            [
                name,
                f"{source.documents_in:,}",
                f"{source.documents_out:,}",
                f"{source.characters_out:,}",
                f"{source.exact_duplicates + source.near_duplicates:,}"
                + (f" (kept {kept})" if kept else ""),
                f"{source.too_short + source.quality_filtered:,}",
            ]
        )
    header = ["source", "documents in", "out", "characters out", "duplicates removed", "filtered"]
    return (
        "Corpus sources (deduplication runs across them; a cluster keeps its earliest "
        "document, sources in the recipe's order):\n\n" + _table(header, rows) + "\n"
    )


def _mixture_table(rows: list[dict]) -> str:
    table = [
        [
            row["source"],
            f"{row['weight']:.1%}"
            if row["weight"] is not None
            else f"{row['tokens_asked']:,} tokens",
            f"{row['share']:.2%}",
            f"{row['tokens']:,}",
            f"{row['epochs']:.2f}",
        ]
        for row in rows
    ]
    return (
        "The training mix, as pretraining drew it (hanlm/data/mixture.py):\n\n"
        + _table(["source", "asked", "drawn", "tokens", "epochs"], table)
        + "\n"
    )


def _contamination_by_source(report: DecontamReport, sources: list[str]) -> str:
    rows = [
        [bench, *(f"{counts.get(source, 0):,}" for source in sources)]
        for bench, counts in report.by_source.items()
    ]
    return (
        "\nDirty and partial items by the source whose documents held them (an item in two "
        "sources counts in both):\n\n" + _table(["benchmark", *sources], rows) + "\n"
    )


def _training_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    records = _jsonl(files.pretrain_metrics)
    train = [(record["step"], record["loss"]) for record in records if "loss" in record]
    val = [(record["step"], record["val_loss"]) for record in records if "val_loss" in record]
    if not train:
        return _missing("pretrain")
    out: list[str] = []
    curves = {"train": tuple(zip(*train, strict=True))}
    if val:
        curves["validation"] = tuple(zip(*val, strict=True))
    by_source: dict[str, list[tuple[int, float]]] = {}
    for record in records:  # OLMo-style: each corpus source's validation loss apart
        for source, loss in record.get("val_loss_by_source", {}).items():
            by_source.setdefault(source, []).append((record["step"], loss))
    for source, points in by_source.items():
        curves[f"validation: {source}"] = tuple(zip(*points, strict=True))
    sft_records = _jsonl(files.sft_metrics)
    path = report_plots.loss_curves(curves, files.plots / "loss.png")
    out.append(f"![pretraining loss]({path.relative_to(files.root)})\n\n")
    speed = [record for record in records if record.get("tokens_per_s")]
    summary = PretrainSummary.read_if_present(files.pretrain_summary)
    mfus = [record["mfu"] for record in speed if record.get("mfu") is not None]
    tps = sorted(record["tokens_per_s"] for record in speed)
    median_tps = tps[len(tps) // 2] if tps else float("nan")
    median_mfu = sorted(mfus)[len(mfus) // 2] if mfus else None
    out.append(
        f"{summary.step if summary else train[-1][0]} steps, "
        f"{summary.tokens if summary else records[-1].get('tokens', 0):,} "
        f"tokens; final train loss {train[-1][1]:.3f}"
        + (f", validation loss {val[-1][1]:.3f}" if val else "")
        + (f", bits per byte {records[-1]['val_bpb']:.3f}" if "val_bpb" in records[-1] else "")
        + f". Median throughput {median_tps:,.0f} tokens/s"
        + (f", MFU {median_mfu:.1%} of the measured peak" if median_mfu is not None else "")
        + ".\n\n"
    )
    if speed:
        path = report_plots.throughput(
            [record["step"] for record in speed],
            [record["tokens_per_s"] for record in speed],
            [record.get("mfu") for record in speed],
            files.plots / "throughput.png",
        )
        out.append(f"![throughput and MFU]({path.relative_to(files.root)})\n")
    if sft_records:
        sft = [(record["step"], record["loss"]) for record in sft_records if "loss" in record]
        if sft:
            path = report_plots.loss_curves(
                {"SFT": tuple(zip(*sft, strict=True))}, files.plots / "sft_loss.png"
            )
            out.append(f"\n![SFT loss]({path.relative_to(files.root)})\n")
    return "".join(out)


def _eval_results(files: RunFiles) -> EvalResults | None:
    return EvalResults.read_if_present(files.eval_results)


def _model_label(name: str, files: RunFiles) -> str:
    """`pretrain` or `sft` for a run's own exports (their folders are .../pretrain/hf)."""
    path = Path(name)
    if path.name == files.export_folder and path.parent.name:
        return path.parent.name
    return path.name or name


# Per-item scores the contamination section sets clean against dirty, with their names there.
GAP_METRICS = {"acc": "accuracy", "gold_margin": "log-likelihood margin"}


def _split_scores(samples: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Samples of the scored benchmark tasks (those decontamination split) by (model, task)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for sample in samples:
        if sample.get("contamination") is not None:
            groups.setdefault((sample["model"], sample["task"]), []).append(sample)
    return groups


def _pooled_by_group(
    by_task: dict[tuple[str, str], list[dict]], groups: dict[str, list[str]]
) -> dict[tuple[str, str], list[dict]]:
    """The tasks of an lm-eval group (KMMLU's 45 subjects) pooled under the outermost group's
    name, so the section shows one row per benchmark; other tasks as they are."""

    def leaves(name: str) -> list[str]:
        return [t for m in groups[name] for t in (leaves(m) if m in groups else [m])]

    inner = {m for members in groups.values() for m in members}
    outermost = [g for g in groups if g not in inner]
    owner = {task: group for group in outermost for task in leaves(group)}
    pooled: dict[tuple[str, str], list[dict]] = {}
    for (model, task), samples in by_task.items():
        if task in owner:  # ids are per task: made distinct within the group
            samples = [{**s, "item_id": f"{task}/{s['item_id']}"} for s in samples]
        pooled.setdefault((model, owner.get(task, task)), []).extend(samples)
    return pooled


def _gaps(samples: list[dict]) -> dict[str, dict]:
    """metric -> clean, dirty and dirty - clean, each with its bootstrap interval."""
    from hanlm.evals import contamination  # deferred: numpy

    out = {}
    for metric in GAP_METRICS:
        split = contamination.scores_by_split(samples, metric)
        if split["clean"] and split["dirty"]:
            out[metric] = contamination.dirty_clean_gap(split["clean"], split["dirty"])
    return out


def _ci(interval, signed: bool = True) -> str:
    pattern = "{:+.3f}" if signed else "{:.3f}"
    return f"{pattern.format(interval.value)} [{pattern.format(interval.low)}, {pattern.format(interval.high)}]"


def _chance(samples: list[dict]) -> float | None:
    """The accuracy of guessing: the mean of 1 / choices over the items; None for a task whose
    answers are generated (no choices to guess among)."""
    if not all(sample.get("loglikelihoods") for sample in samples):
        return None
    return sum(1 / len(sample["loglikelihoods"]) for sample in samples) / len(samples)


def _gap_rows(label: str, task: str, gaps: dict[str, dict]) -> list[list[str]]:
    return [
        [label, task, GAP_METRICS[metric], *_cells(metric, gap)] for metric, gap in gaps.items()
    ]


def _cells(metric: str, gaps: dict) -> list[str]:
    """Clean, dirty, dirty - clean: a margin and a gap may be negative, an accuracy not."""
    signed = metric != "acc"
    return [_ci(gaps["clean"], signed), _ci(gaps["dirty"], signed), _ci(gaps["gap"])]


def _gap_verdict(label: str, task: str, gaps: dict[str, dict], chance: float | None) -> str:
    """What the intervals say, in words: clean accuracy against chance, dirty against clean."""
    acc = gaps.get("acc")
    if acc is None:
        return ""
    clean, gap = acc["clean"], acc["gap"]
    if chance is None:
        against = ""
    else:
        above = "above" if clean.low > chance else "below" if clean.high < chance else "not above"
        against = f" is {above} chance ({chance:.2f})"
    inflated = (
        "dirty items score higher: contamination inflates accuracy"
        if gap.low > 0
        else "dirty items score lower"
        if gap.high < 0
        else "no difference between dirty and clean items beyond the noise"
    )
    return (
        f"\n{label} on {task}: clean accuracy {clean.value:.3f}{against}; "
        f"dirty minus clean {gap.value:+.3f} [{gap.low:+.3f}, {gap.high:+.3f}]: {inflated}.\n"
    )


def _comparison_rows(
    kept: list[dict], dropped: list[dict], task: str, dropped_label: str
) -> list[list[str]]:
    """Before and after decontamination: one row per corpus, clean and dirty side by side."""
    rows = []
    for corpus, samples in (("kept (this run)", kept), (dropped_label, dropped)):
        gaps = _gaps(samples)
        for metric, gap in gaps.items():
            rows.append([corpus, task, GAP_METRICS[metric], *_cells(metric, gap)])
    return rows


def _comparison(files: RunFiles, kept_by_task: dict[str, list[dict]]) -> str:
    """The same recipe trained without the flagged documents, beside this run's base model."""
    from hanlm.evals import contamination  # deferred: numpy

    if files.compare_eval_samples is None or not files.compare_eval_samples.is_file():
        return (
            "\nNo comparison without the contaminated documents in this run "
            "(`decontam.compare_drop = true` trains one).\n"
        )
    results = _eval_results(files)
    groups = results.groups if results is not None else {}
    dropped = _pooled_by_group(_split_scores(_jsonl(files.compare_eval_samples)), groups)
    report = DecontamReport.read_if_present(files.decontam_report)
    only = report.action_sources if report is not None else []
    label = (
        f"{', '.join(only)}'s leaks dropped (compare/drop)" if only else "dropped (compare/drop)"
    )
    out: list[str] = []
    rows, verdicts = [], []
    for (_, task), samples in dropped.items():
        kept = kept_by_task.get(task)
        if not kept:
            continue
        rows += _comparison_rows(kept, samples, task, label)
        before, after = _gaps(kept).get("acc"), _gaps(samples).get("acc")
        if before and after:
            gap = after["gap"]
            # The field's lesson is that the lead vanishes; below clean is a draw of harder items.
            fell = (
                "still above the clean level"
                if gap.low > 0
                else "below the clean level: the leaked items happen to be harder ones"
                if gap.high < 0
                else "at the clean level"
            )
            verdicts.append(
                f"{task}: dirty-item accuracy {before['dirty'].value:.3f} with the leaked documents "
                f"in training, {after['dirty'].value:.3f} without them, {fell} "
                f"(dirty minus clean {_ci(gap)}; clean {before['clean'].value:.3f} and "
                f"{after['clean'].value:.3f})."
            )
        parts = []
        for metric in GAP_METRICS:
            paired = contamination.paired_dirty_clean_gap(kept, samples, metric)
            if paired is None:
                continue
            verdict = "the leaks add it" if paired["gap"].low > 0 else "within the noise"
            parts.append(
                f"{GAP_METRICS[metric]}: dirty items {_ci(paired['dirty'])}, clean items "
                f"{_ci(paired['clean'])}, difference {_ci(paired['gap'])} ({verdict})"
            )
        if parts:
            verdicts.append(
                f"{task}, item by item, the same items with minus without the leaked documents: "
                + "; ".join(parts)
                + ". A dirty − clean gap also holds how hard the leaked items happen to be; this "
                "difference of differences does not."
            )
    if not rows:
        return "\nThe comparison's eval has no benchmark task in common with this run's.\n"
    out.append(
        "\n**Before and after decontamination.** The same recipe (seed, steps) trained on the "
        "corpus with the flagged documents dropped (`decontam.action = drop`, in "
        "`compare/drop/`), its tokenizer too, as a run that drops them would; its base model "
        "beside this run's:\n\n"
    )
    out.append(
        _table(["training corpus", "task", "score", "clean", "dirty", "dirty − clean"], rows)
    )
    out += [f"\n{verdict}\n" for verdict in verdicts]
    return "".join(out)


def _contamination_section(files: RunFiles) -> str:
    from hanlm.evals import contamination  # deferred: numpy
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    results = _eval_results(files)
    if results is None:
        return _missing("eval")
    groups = _pooled_by_group(_split_scores(_jsonl(files.eval_samples)), results.groups)
    if not groups:
        return "_No benchmark task of this run's eval was split by a decontamination report._\n"
    out: list[str] = [
        f"Mean per item with a {contamination.BOOTSTRAP_CONFIDENCE:.0%} bootstrap interval over "
        f"items ({contamination.BOOTSTRAP_RESAMPLES:,} resamples, seed "
        f"{contamination.BOOTSTRAP_SEED}); dirty: the items decontamination found in the "
        "training corpus (dirty or partial), clean: the rest. The margin is the log-likelihood "
        "of the right answer minus the best wrong one.\n\n"
    ]
    rows, verdicts, bars, spans, base_samples = [], [], {}, {}, {}
    for (model, task), samples in groups.items():
        label = _model_label(model, files)
        gaps = _gaps(samples)
        rows += _gap_rows(label, task, gaps)
        verdicts.append(_gap_verdict(label, task, gaps, _chance(samples)))
        if "acc" in gaps:
            name = f"{task}\n{label}"
            bars[name] = {split: gaps["acc"][split].value for split in ("clean", "dirty")}
            spans[name] = {
                split: (gaps["acc"][split].low, gaps["acc"][split].high)
                for split in ("clean", "dirty")
            }
        if label == Path(files.pretrain_summary).parent.name:  # the base model: compared below
            base_samples[task] = samples
    out.append(_table(["model", "task", "score", "clean", "dirty", "dirty − clean"], rows))
    out += verdicts
    if bars:
        path = report_plots.grouped_bars(
            bars, files.plots / "clean_vs_dirty.png", ylabel="accuracy", ylim=(0, 1),
            intervals=spans,
        )  # fmt: skip
        out.append(f"\n![clean vs dirty]({path.relative_to(files.root)})\n")
    decontam = DecontamReport.read_if_present(files.decontam_report)
    if decontam is not None and decontam.action == "keep":
        out.append(
            "\nThis run kept the contaminated documents in training on purpose "
            "(`decontam.action = keep`), so the gap between dirty and clean items measures what "
            "contamination adds; a real recipe drops them.\n"
        )
        out.append(_comparison(files, base_samples))
    return "".join(out)


# A variant that neither initialises nor trains the template rows closing fewer answers than the
# best other variant by at least this share counts as the field's failure reproduced (5 of 50
# answers: more than one or two answers' noise).
CLOSURE_MARGIN = 0.1


def _closure_checks(files: RunFiles, by_variant: dict) -> dict[str, dict]:
    """variant name -> its closure.json (the main SFT's or a compared variant's)."""
    main = _read(files.closure) or {}
    checks = {}
    for name in by_variant:
        check = main if main.get("variant") == name else _read(files.ablation_closure(name))
        if check:
            checks[name] = check
    return checks


def _variant_cell(check: dict) -> str:
    if check.get("method") == "lora":
        rows = "rows trained" if check.get("rows_trained") else "rows frozen"
        return f"LoRA, init {check.get('init')}, {rows}"
    return f"full, init {check.get('init')}"


def _rate_cell(check: dict) -> str:
    low, high = check.get("interval") or (None, None)
    span = "" if low is None else f" [{low:.2f}, {high:.2f}]"
    return f"{check['rate']:.2f}{span}"


def _norm_cell(diagnosis: dict | None, token: str = "eot") -> str:
    rows = (diagnosis or {}).get("row_norms", {}).get("embedding", {})
    value = rows.get("template", {}).get(token)
    return "-" if value is None else f"{value:.2f}"


def _rank_cell(diagnosis: dict | None) -> str:
    rank = (diagnosis or {}).get("eot_rank")
    if not rank:
        return "-"
    return f"{rank['median_rank']:,} (top-1 {rank['top1']:.0%})"


def _audit_norms(audit: dict) -> str:
    """What pretraining did to the rows: trained rows against the template rows and the start."""
    norms = audit.get("row_norms", {}).get("embedding")
    if not norms:
        return ""
    counts = {token["name"]: token.get("pretrain_count") for token in audit.get("tokens", [])}
    template = ", ".join(
        f"{name} {value:.2f} (seen {_fmt(counts.get(name))} times)"
        for name, value in norms["template"].items()
    )
    start = audit["row_norms"].get("initial_norm")
    pushed = ""
    if audit.get("tied") and min(norms["template"].values()) > norms["ordinary_mean"]:
        pushed = (
            " The never-seen rows moved further than the trained ones: in a tied head the "
            "softmax pushes every row it never predicts away from the hidden states, and Adam "
            "steps a row by the learning rate however small its gradient."
        )
    return (
        f"\nAfter pretraining (the audit, embedding rows): trained rows' mean norm "
        f"{norms['ordinary_mean']:.2f} (median {norms['ordinary_median']:.2f})"
        + (f", from {start:.2f} at initialisation" if start is not None else "")
        + f"; template rows: {template}.{pushed}\n"
    )


def _ranks(check: dict) -> str:
    """<|eot|>'s median rank at answer ends before -> after SFT, for one closure.json."""
    diagnosis = check.get("diagnosis", {})
    return f"{_rank_cell(diagnosis.get('before'))} → {_rank_cell(diagnosis.get('after'))}"


def _frozen(check: dict) -> bool:
    """LoRA with the template rows frozen: they end SFT where pretraining and the init put them."""
    return check.get("method") == "lora" and not check.get("rows_trained")


def _failing_and_best(checks: dict) -> tuple[str, str] | None:
    """(the variant that should fail, the best one that should not): the frozen-row variant that
    closed fewest against the best other; without frozen rows, full fine-tuning from `none`
    against the best initialised one."""
    frozen = [name for name, check in checks.items() if _frozen(check)]
    if not frozen:
        frozen = [n for n, c in checks.items() if c.get("init") == "none"]
    others = [name for name in checks if name not in frozen]
    if not frozen or not others:
        return None
    worst = min(frozen, key=lambda name: checks[name]["rate"])
    return worst, max(others, key=lambda name: checks[name]["rate"])


def _counted(name: str, check: dict) -> str:
    return f"`{name}` ended {check['closed']} of {check['total']} ({_rate_cell(check)})"


def _why_frozen(name: str, check: dict, trained_norm: float | None) -> str:
    """Why a frozen-row variant closed as many answers as it did, with its numbers."""
    before = check.get("diagnosis", {}).get("before")
    norm = (before or {}).get("row_norms", {}).get("embedding", {}).get("template", {}).get("eot")
    ranks = f"<|eot|>'s median rank at answer ends {_ranks(check)}"
    if check.get("init") == "mean":
        return (
            f" {_counted(name, check)}: a row at the mean of the trained rows scores, for any "
            "hidden state, the mean of their logits, never the largest, so frozen there it is "
            f"never the greedy choice ({ranks})."
        )
    if check.get("init") == "none" and norm is not None and trained_norm is not None:
        longer = norm > trained_norm
        return (
            f" {_counted(name, check)}: the never-seen row is where pretraining left it, "
            f"norm {norm:.2f} against the trained rows' {trained_norm:.2f}"
            + (
                " (the softmax pushed it away from the hidden states and made it long), so "
                "the adapters can turn the last hidden states toward it and let it win"
                if longer
                else ""
            )
            + f" ({ranks})."
        )
    return f" {_counted(name, check)} ({ranks})."


def _why_open(name: str, check: dict) -> str:
    """What kept a variant whose rows trained from ending every answer: loops, with <|eot|>'s
    top-1 share where the reference answers end."""
    left = check["total"] - check["closed"]
    if left == 0 or "unclosed_looping" not in check:
        return ""
    after = (check.get("diagnosis", {}).get("after") or {}).get("eot_rank") or {}
    top1 = (
        f"; where the reference answers end, <|eot|> is its first choice {after['top1']:.0%} of the time"
        if after
        else ""
    )
    return (
        f" `{name}` left {left} answers open, {check['unclosed_looping']} of them loops (at "
        f"least half their 4-grams repeated, to the {check['max_new_tokens']}-token limit){top1}."
    )


def _closure_verdict(checks: dict, audit: dict) -> str:
    """The field's failure reproduced or not, and why each frozen-row variant closed as it did,
    said with this run's numbers."""
    pair = _failing_and_best(checks)
    if pair is None:
        return ""
    failing, best_name = pair
    worst, best = checks[failing], checks[best_name]
    shortfall = best["rate"] - worst["rate"]
    rates = f"{_counted(failing, worst)}, `{best_name}` {best['closed']} of {best['total']} ({_rate_cell(best)})"
    if shortfall >= CLOSURE_MARGIN:
        head = (
            f"\n**The field's failure, reproduced:** {rates}, 95% intervals in brackets "
            f"({shortfall:.0%} fewer; the card counts a shortfall of {CLOSURE_MARGIN:.0%} or more)."
        )
    else:
        short = "at least as many" if shortfall <= 0 else f"a shortfall of {shortfall:.0%}"
        head = (
            f"\n**Not reproduced at demo size:** {rates}: {short}, under the "
            f"{CLOSURE_MARGIN:.0%} shortfall the card asks for."
        )
        if best["rate"] < 0.5:
            head += (
                " No variant taught this model to end most answers: this SFT is too short "
                "for any, so it cannot show what the rows add."
            )
        elif not _frozen(worst):
            head += (
                " Full fine-tuning trains every row, the never-seen ones too: without "
                "initialisation this SFT still moved them as far as ending needs (LoRA with "
                "the rows frozen, `sft.compare`, is the setup that cannot)."
            )
    trained_norm = audit.get("row_norms", {}).get("embedding", {}).get("ordinary_mean")
    open_answers = "".join(
        _why_open(name, check) for name, check in checks.items() if not _frozen(check)
    )
    if open_answers:
        head += "\n\nWith the rows trained:" + open_answers
    frozen = [(name, check) for name, check in checks.items() if _frozen(check)]
    why = "".join(_why_frozen(name, check, trained_norm) for name, check in frozen)
    if frozen:
        why = "\n\nWith the rows frozen (LoRA, `train_new_token_rows = false`):" + why
    return head + why + "\n"


def _closure_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    by_variant = _read(files.closure_by_variant)
    if by_variant is None:
        return _missing("sft")
    out: list[str] = []
    checks = _closure_checks(files, by_variant)
    rows = []
    for name, check in checks.items():
        diagnosis = check.get("diagnosis", {})
        before, after = diagnosis.get("before"), diagnosis.get("after")
        rows.append(
            [
                name,
                _variant_cell(check),
                f"{check['closed']} / {check['total']}",
                _rate_cell(check),
                f"{_rank_cell(before)} → {_rank_cell(after)}",
                f"{_norm_cell(before)} → {_norm_cell(after)}",
            ]
        )
    header = [
        "variant",
        "fine-tuning",
        "answers ending with <|eot|>",
        "closure rate [95% interval]",
        "<|eot|> median rank at answer ends, before → after SFT",
        "<|eot|> row norm, before → after SFT",
    ]
    out.append(_table(header, rows))
    out.append(
        "\nRank: where a held-out reference answer ends, how many tokens' logits beat <|eot|>'s "
        "(0: greedy decoding ends the answer there). Before SFT: the pretrained model with the "
        "initialisation applied (LoRA's adapters start at zero). Intervals: Wilson's, over the "
        "held-out prompts. The first row is the run's chat model; the others are `sft.compare`'s "
        "variants, trained on the same data and steps.\n"
    )
    audit = _read(files.audit) or {}
    out.append(_audit_norms(audit))
    after_norms = [
        (name, check["diagnosis"]["after"]["row_norms"]["embedding"]["ordinary_mean"])
        for name, check in checks.items()
        if check.get("diagnosis", {}).get("after", {}).get("row_norms", {}).get("embedding")
    ]
    if after_norms:
        out.append(
            "\nAfter SFT, trained rows' mean norm: "
            + ", ".join(f"{name} {value:.2f}" for name, value in after_norms)
            + ".\n"
        )
    untrained = audit.get("untrained_template_tokens")
    if untrained is not None:
        out.append(
            f"\nThe audit found these template tokens untrained before SFT: {', '.join(untrained) or 'none'}.\n"
        )
    out.append(_closure_verdict(checks, audit))
    path = report_plots.grouped_bars(
        {"closure rate": {name: float(check["rate"]) for name, check in checks.items()}},
        files.plots / "closure.png",
        ylabel="share of answers that end",
        ylim=(0, 1.05),
        intervals={
            "closure rate": {
                name: tuple(check["interval"])
                for name, check in checks.items()
                if "interval" in check
            }
        },
    )
    out.append(f"\n![closure by variant]({path.relative_to(files.root)})\n")
    return "".join(out)


# the direction probe's groups of facts (hanlm.evals.tasks.direction's reverse_stated column)
DIRECTION_GROUPS = ((None, "all facts"), (True, "reverse stated"), (False, "reverse not stated"))


def _direction_row(label: str, group: str, items: list[dict]) -> list:
    forward = [sample["loglikelihoods"]["forward"][0] for sample in items]
    reverse = [sample["loglikelihoods"]["reverse"][0] for sample in items]
    mean_f, mean_r = sum(forward) / len(forward), sum(reverse) / len(reverse)
    return [
        label,
        group,
        len(items),
        f"{mean_f:.2f}",
        f"{mean_r:.2f}",
        f"{mean_f - mean_r:.2f}",
        f"{sum(sample['scores']['forward_acc'] for sample in items) / len(items):.2f}",
        f"{sum(sample['scores']['reverse_acc'] for sample in items) / len(items):.2f}",
    ]


def _mean_reverse(items: list[dict]) -> float:
    return sum(sample["scores"]["reverse_logprob"] for sample in items) / len(items)


def _by_group(by_model: dict, files: RunFiles):
    """(model label, {stated: its samples}) for each model whose facts fall in both groups."""
    for model, items in by_model.items():
        groups = {
            stated: [sample for sample in items if sample.get("reverse_stated") is stated]
            for stated in (True, False)
        }
        if groups[True] and groups[False]:
            yield _model_label(model, files), groups


def _group_contrast(label: str, groups: dict) -> str:
    def mean(rows, key):
        return sum(sample["scores"][key] for sample in rows) / len(rows)

    with_, without = groups[True], groups[False]
    return (
        f"{label}: reverse log-prob {mean(with_, 'reverse_logprob'):.2f} with reverse "
        f"statements vs {mean(without, 'reverse_logprob'):.2f} without, reverse rank accuracy "
        f"{mean(with_, 'reverse_acc'):.2f} vs {mean(without, 'reverse_acc'):.2f}, gap "
        f"{mean(with_, 'gap'):.2f} vs {mean(without, 'gap'):.2f}"
    )


def _direction_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    samples = [sample for sample in _jsonl(files.eval_samples) if sample.get("task") == "direction"]
    if not samples:
        return _missing("eval (direction)")
    out: list[str] = []
    by_model: dict[str, list[dict]] = {}
    for sample in samples:
        by_model.setdefault(sample.get("model", "model"), []).append(sample)
    rows, reverse, first = [], {}, None
    for model, items in by_model.items():
        label = _model_label(model, files)
        for stated, group in DIRECTION_GROUPS:
            members = [
                sample
                for sample in items
                if stated is None or sample.get("reverse_stated") is stated
            ]
            if members and (stated is None or len(members) < len(items)):
                rows.append(_direction_row(label, group, members))
                if stated is not None:
                    reverse.setdefault(label, {})[group] = _mean_reverse(members)
        if first is None:  # the plot shows the first model: in a run, the base model
            first = (items, model)
    header = ["model", "facts", "n", "forward log-prob", "reverse log-prob", "gap"]
    out.append(_table([*header, "forward rank acc", "reverse rank acc"], rows))
    items, model = first
    path = report_plots.direction_histograms(
        [sample["loglikelihoods"]["forward"][0] for sample in items],
        [sample["loglikelihoods"]["reverse"][0] for sample in items],
        files.plots / "direction.png",
    )
    out.append(
        f"\n![direction probe, {_model_label(model, files)}]({path.relative_to(files.root)})\n"
    )
    stated = sum(1 for sample in items if sample.get("reverse_stated") is True)
    if stated:
        out.append(
            f"\nThe training text states {stated} of the {len(items)} probed facts also object first "
            '("B는 A의 수도이다"; `demo.reverse_share`, a seeded pick, or `hanlm facts` for a '
            "user's table) and the others only subject first, so one model answers both kinds. "
            "Forward and reverse answers are different words, so the controlled comparison is "
            "each direction's score across the two groups: "
            + "; ".join(
                _group_contrast(label, rows_of) for label, rows_of in _by_group(by_model, files)
            )
            + ". The field report's conclusion: each direction must be in the data.\n"
        )
        path = report_plots.grouped_bars(
            reverse, files.plots / "direction_groups.png", ylabel="reverse log-prob, right answer"
        )
        out.append(f"\n![reverse log-prob by group]({path.relative_to(files.root)})\n")
    elif any(sample.get("reverse_stated") is False for sample in items):
        out.append(
            "\nThe training text states every fact subject first only, so the reverse direction "
            "is never seen in training text.\n"
        )
    else:
        out.append(
            "\nThe facts table does not say which facts the training text also states object "
            "first (no `reverse_stated` column), so the probe cannot compare the two kinds.\n"
        )
    return "".join(out)


def _repetition_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    results = _eval_results(files)
    rows, groups = [], {}
    for model, tasks in (results.results if results else {}).items():
        metrics = tasks.get("repetition", {}).get("full", {})
        keys = sorted({name.rsplit("/", 1)[0] for name in metrics})
        for key in keys:
            without, with_penalty = (
                score.value if (score := metrics.get(f"{key}/{arm}")) else None
                for arm in ("without", "with")
            )
            change = None if without is None or with_penalty is None else with_penalty - without
            rows.append(
                [_model_label(model, files), key, _fmt(without), _fmt(with_penalty), _fmt(change)]
            )
            if key in PLOTTED_REPETITION and without is not None:
                groups[f"{key}\n{_model_label(model, files)}"] = {
                    "without penalty": without,
                    "with penalty": with_penalty,
                }
    if not rows:
        return _missing("eval (repetition)")
    out: list[str] = []
    penalty = ""
    if files.config.is_file():
        generate = load_config(files.config).generate
        penalty = (
            f" Penalty: repetition {generate.repetition_penalty} (CTRL rule), no-repeat n-gram "
            f"{generate.no_repeat_ngram_size}, frequency {generate.frequency_penalty}, presence "
            f"{generate.presence_penalty}; special tokens exempt: {generate.exempt_special_tokens}."
        )
    out.append(f"Greedy continuations of document openings, fixed length.{penalty}\n\n")
    out.append(_table(["model", "metric", "without penalty", "with penalty", "change"], rows))
    if groups:
        path = report_plots.grouped_bars(
            groups, files.plots / "repetition.png", ylabel="share repeated", ylim=(0, 1)
        )
        out.append(f"\n![repetition]({path.relative_to(files.root)})\n")
    return "".join(out)


def _distillation_section() -> str:
    return (
        "---\n\n"
        "*Distillation.* The field report's distillation loss toward a larger teacher (Gemma), "
        "added during pretraining, made every domain worse and was dropped. In hanlm it is "
        "off by default (`distill.enabled = false`). `benchmarks/distill_ablation.py` trains the "
        "same student with and without it and reports both; its figures are in "
        "`benchmarks/README.md`.\n"
    )


SECTIONS = (  # (title, the field report's lesson, the body measured in this run)
    (
        "1. Plan: will it fit, what will it cost",
        "a 1.35B model with its AdamW states needs more than 25 GB: one "
        "RTX 5090 (32 GB) cannot train it; 8 of them trained ~22B tokens in about 590 GPU-hours, "
        "~240 USD at 0.40 USD per GPU-hour.",
        _plan_section,
    ),
    (
        "2. Preflight: GO or NO-GO before the money is spent",
        "on a GPU marketplace, 3 of 4 non-datacenter hosts could not even "
        "start training because of their network.",
        _preflight_section,
    ),
    (
        "3. Corpus and contamination",
        f"Wikipedia-heavy pretraining data overlapped the benchmarks: "
        f"{FIELD_BOOLQ[0]:,} of KoBEST BoolQ's {FIELD_BOOLQ[1]:,} test questions substantially "
        f"matched training data ({FIELD_BOOLQ[0] / FIELD_BOOLQ[1]:.0%}).",
        _data_section,
    ),
    (
        "4. Pretraining: loss, throughput and MFU",
        "FP8 was the realistic precision on RTX 5090s; FP4 looked faster in "
        "isolation but was slower end to end. hanlm trains in bf16 or FP8 and refuses FP4.",
        _training_section,
    ),
    (
        "5. Clean versus contaminated scores",
        "the model's KoBEST lead over gemma-3-1b came from contaminated "
        "items; once they were removed the lead vanished.",
        _contamination_section,
    ),
    (
        "6. Chat answers that end: closure rate by initialisation and fine-tuning",
        f"pretraining never saw the chat template's special tokens and their "
        f"embeddings were never initialised: after SFT the model closed "
        f"{FIELD_CLOSURE['none'][0]} of {FIELD_CLOSURE['none'][1]} answers; with those vectors "
        f"initialised separately, {FIELD_CLOSURE['mean'][0]} of {FIELD_CLOSURE['mean'][1]}.",
        _closure_section,
    ),
    (
        "7. Knowledge in both directions",
        f'"A\'s capital is B" was learned, "B is the capital of which '
        f'country" much less: mean log-prob of the right answer {FIELD_DIRECTION["forward"]} '
        f"forward, {FIELD_DIRECTION['reverse']} reverse.",
        _direction_section,
    ),
    (
        "8. Repetition with and without the decoding penalty",
        "long generations fell into repeating words; data changes did not "
        "cure it, a decoding-time repetition penalty did.",
        _repetition_section,
    ),
)


# --- the whole card -----------------------------------------------------------------------------


def build(files: RunFiles) -> str:
    """The report card's markdown; its figures are written into `files.plots`."""
    parts = [
        f"# hanlm report card: {files.name}\n\n",
        "Each section sets a lesson of the field report (a 1.35B Korean model pretrained from "
        "scratch on ~22B tokens for about 240 USD on 4-8 RTX 5090s) beside what this run "
        f"measured. Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n",
        *(_heading(title, lesson) + section(files) for title, lesson, section in SECTIONS),
        _distillation_section(),
    ]
    return "\n".join(parts)
