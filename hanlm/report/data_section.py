"""The report card's data and training sections: what the corpus kept by source, the mixture, and the loss, throughput and MFU curves."""

from __future__ import annotations

from hanlm.data.corpus import CorpusStats
from hanlm.data.decontam.outputs import DecontamReport, read_items
from hanlm.demo.records import read_planted
from hanlm.report.markdown import missing, table
from hanlm.report.run_files import RunFiles
from hanlm.train.results import PretrainSummary, read_metrics


def data_section(files: RunFiles) -> str:
    stats = CorpusStats.read_if_present(files.corpus_stats)
    if stats is None:
        return missing("corpus")
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
        return "".join(out) + missing("decontam")
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
    out.append(table(["benchmark", "items", "dirty", "partial", "clean"], rows))
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
    planted = read_planted(files.planted)  # the demo world's (a run on other data has none)
    if planted is not None:
        found = {
            item.item_id for item in read_items(files.decontam_items) if item.status == "dirty"
        }
        items = {copy.item_id for copy in planted}
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
        "document, sources in the recipe's order):\n\n" + table(header, rows) + "\n"
    )


def _mixture_table(rows: list[dict]) -> str:
    cells = [
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
        + table(["source", "asked", "drawn", "tokens", "epochs"], cells)
        + "\n"
    )


def _contamination_by_source(report: DecontamReport, sources: list[str]) -> str:
    rows = [
        [bench, *(f"{counts.get(source, 0):,}" for source in sources)]
        for bench, counts in report.by_source.items()
    ]
    return (
        "\nDirty and partial items by the source whose documents held them (an item in two "
        "sources counts in both):\n\n" + table(["benchmark", *sources], rows) + "\n"
    )


def training_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    records = read_metrics(files.pretrain_metrics)
    if not records:
        return missing("pretrain")
    train = [(record.step, record.loss) for record in records]
    val = [(record.step, record.val_loss) for record in records if record.val_loss is not None]
    out: list[str] = []
    curves = {"train": tuple(zip(*train, strict=True))}
    if val:
        curves["validation"] = tuple(zip(*val, strict=True))
    by_source: dict[str, list[tuple[int, float]]] = {}
    for record in records:  # OLMo-style: each corpus source's validation loss apart
        for source, loss in (record.val_loss_by_source or {}).items():
            by_source.setdefault(source, []).append((record.step, loss))
    for source, points in by_source.items():
        curves[f"validation: {source}"] = tuple(zip(*points, strict=True))
    path = report_plots.loss_curves(curves, files.plots / "loss.png")
    out.append(f"![pretraining loss]({path.relative_to(files.root)})\n\n")
    speed = [record for record in records if record.tokens_per_s]
    summary = PretrainSummary.read_if_present(files.pretrain_summary)
    mfus = sorted(record.mfu for record in speed if record.mfu is not None)
    tps = sorted(record.tokens_per_s for record in speed)
    median_tps = tps[len(tps) // 2] if tps else float("nan")
    median_mfu = mfus[len(mfus) // 2] if mfus else None
    last = records[-1]
    out.append(
        f"{summary.step if summary else train[-1][0]} steps, "
        f"{summary.tokens if summary else last.tokens:,} "
        f"tokens; final train loss {train[-1][1]:.3f}"
        + (f", validation loss {val[-1][1]:.3f}" if val else "")
        + (f", bits per byte {last.val_bpb:.3f}" if last.val_bpb is not None else "")
        + f". Median throughput {median_tps:,.0f} tokens/s"
        + (f", MFU {median_mfu:.1%} of the measured peak" if median_mfu is not None else "")
        + ".\n\n"
    )
    if speed:
        path = report_plots.throughput(
            [record.step for record in speed],
            [record.tokens_per_s for record in speed],
            [record.mfu for record in speed],
            files.plots / "throughput.png",
        )
        out.append(f"![throughput and MFU]({path.relative_to(files.root)})\n")
    sft = [(record.step, record.loss) for record in read_metrics(files.sft_metrics)]
    if sft:
        path = report_plots.loss_curves(
            {"SFT": tuple(zip(*sft, strict=True))}, files.plots / "sft_loss.png"
        )
        out.append(f"\n![SFT loss]({path.relative_to(files.root)})\n")
    return "".join(out)
