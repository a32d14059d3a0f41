"""The report card's contamination section: benchmark scores on clean and contaminated items apart, and against the same recipe trained without the flagged documents."""

from __future__ import annotations

from pathlib import Path

from hanlm.data.decontam.outputs import DecontamReport
from hanlm.evals.results import EvalResults, read_samples
from hanlm.report.markdown import missing, table
from hanlm.report.run_files import RunFiles

# The field report's own figures, quoted beside ours.
FIELD_BOOLQ = (1025, 1404)


def eval_results(files: RunFiles) -> EvalResults | None:
    return EvalResults.read_if_present(files.eval_results)


def model_label(name: str, files: RunFiles) -> str:
    """`pretrain` or `sft` for a run's own exports (their folders are .../pretrain/hf)."""
    path = Path(name)
    if path.name == files.export_folder and path.parent.name:
        return path.parent.name
    return path.name or name


# Per-item scores the contamination section sets clean against dirty, with their names there.
GAP_METRICS = {"acc": "accuracy", "gold_margin": "log-likelihood margin"}


def split_scores(samples: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Samples of the scored benchmark tasks (those decontamination split) by (model, task)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for sample in samples:
        if sample.get("contamination") is not None:
            groups.setdefault((sample["model"], sample["task"]), []).append(sample)
    return groups


def pooled_by_group(
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


def ci(interval, signed: bool = True) -> str:
    pattern = "{:+.3f}" if signed else "{:.3f}"
    return f"{pattern.format(interval.value)} [{pattern.format(interval.low)}, {pattern.format(interval.high)}]"


def chance(samples: list[dict]) -> float | None:
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
    return [ci(gaps["clean"], signed), ci(gaps["dirty"], signed), ci(gaps["gap"])]


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
    results = eval_results(files)
    groups = results.groups if results is not None else {}
    dropped = pooled_by_group(split_scores(read_samples(files.compare_eval_samples)), groups)
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
                f"(dirty minus clean {ci(gap)}; clean {before['clean'].value:.3f} and "
                f"{after['clean'].value:.3f})."
            )
        parts = []
        for metric in GAP_METRICS:
            paired = contamination.paired_dirty_clean_gap(kept, samples, metric)
            if paired is None:
                continue
            verdict = "the leaks add it" if paired["gap"].low > 0 else "within the noise"
            parts.append(
                f"{GAP_METRICS[metric]}: dirty items {ci(paired['dirty'])}, clean items "
                f"{ci(paired['clean'])}, difference {ci(paired['gap'])} ({verdict})"
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
    out.append(table(["training corpus", "task", "score", "clean", "dirty", "dirty − clean"], rows))
    out += [f"\n{verdict}\n" for verdict in verdicts]
    return "".join(out)


def contamination_section(files: RunFiles) -> str:
    from hanlm.evals import contamination  # deferred: numpy
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    results = eval_results(files)
    if results is None:
        return missing("eval")
    groups = pooled_by_group(split_scores(read_samples(files.eval_samples)), results.groups)
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
        label = model_label(model, files)
        gaps = _gaps(samples)
        rows += _gap_rows(label, task, gaps)
        verdicts.append(_gap_verdict(label, task, gaps, chance(samples)))
        if "acc" in gaps:
            name = f"{task}\n{label}"
            bars[name] = {split: gaps["acc"][split].value for split in ("clean", "dirty")}
            spans[name] = {
                split: (gaps["acc"][split].low, gaps["acc"][split].high)
                for split in ("clean", "dirty")
            }
        if label == Path(files.pretrain_summary).parent.name:  # the base model: compared below
            base_samples[task] = samples
    out.append(table(["model", "task", "score", "clean", "dirty", "dirty − clean"], rows))
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
