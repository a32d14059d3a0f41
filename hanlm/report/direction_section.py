"""The report card's knowledge-direction, repetition and distillation sections."""

from __future__ import annotations

from hanlm.config import load_config
from hanlm.evals.results import read_samples
from hanlm.report.contamination_section import eval_results, model_label
from hanlm.report.markdown import fmt, missing, table
from hanlm.report.run_files import RunFiles

FIELD_DIRECTION = {"forward": -1.42, "reverse": -3.23}


PLOTTED_REPETITION = ("seq_rep_2", "seq_rep_4", "rep_32")  # the table has them all


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
            yield model_label(model, files), groups


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


def direction_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    samples = [
        sample for sample in read_samples(files.eval_samples) if sample.get("task") == "direction"
    ]
    if not samples:
        return missing("eval (direction)")
    out: list[str] = []
    by_model: dict[str, list[dict]] = {}
    for sample in samples:
        by_model.setdefault(sample.get("model", "model"), []).append(sample)
    rows, reverse, first = [], {}, None
    for model, items in by_model.items():
        label = model_label(model, files)
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
    out.append(table([*header, "forward rank acc", "reverse rank acc"], rows))
    items, model = first
    path = report_plots.direction_histograms(
        [sample["loglikelihoods"]["forward"][0] for sample in items],
        [sample["loglikelihoods"]["reverse"][0] for sample in items],
        files.plots / "direction.png",
    )
    out.append(
        f"\n![direction probe, {model_label(model, files)}]({path.relative_to(files.root)})\n"
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


def repetition_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    results = eval_results(files)
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
                [model_label(model, files), key, fmt(without), fmt(with_penalty), fmt(change)]
            )
            if key in PLOTTED_REPETITION and without is not None:
                groups[f"{key}\n{model_label(model, files)}"] = {
                    "without penalty": without,
                    "with penalty": with_penalty,
                }
    if not rows:
        return missing("eval (repetition)")
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
    out.append(table(["model", "metric", "without penalty", "with penalty", "change"], rows))
    if groups:
        path = report_plots.grouped_bars(
            groups, files.plots / "repetition.png", ylabel="share repeated", ylim=(0, 1)
        )
        out.append(f"\n![repetition]({path.relative_to(files.root)})\n")
    return "".join(out)


def distillation_section() -> str:
    return (
        "---\n\n"
        "*Distillation.* The field report's distillation loss toward a larger teacher (Gemma), "
        "added during pretraining, made every domain worse and was dropped. In hanlm it is "
        "off by default (`distill.enabled = false`). `benchmarks/distill_ablation.py` trains the "
        "same student with and without it and reports both; its figures are in "
        "`benchmarks/README.md`.\n"
    )
