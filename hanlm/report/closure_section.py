"""The report card's chat section: how many held-out answers each SFT variant ended, and why.

It reads the SFT summary (every variant's closure rate), each variant's closure check and the
audit through their result types (hanlm.train.results); a missing SFT is said, a damaged file
is a UserError naming it.
"""

from __future__ import annotations

from hanlm.report.markdown import fmt, missing, table
from hanlm.report.run_files import RunFiles
from hanlm.train.results import ClosureCheck, ModelDiagnosis, SftSummary, TokenAudit

CLOSURE_MARGIN = 0.1  # the shortfall the card counts as the field's failure reproduced


def closure_checks(files: RunFiles, summary: SftSummary) -> dict[str, ClosureCheck]:
    """variant name -> its closure check (the main SFT's or a compared variant's)."""
    main = ClosureCheck.read(files.closure)
    return {
        name: main if main.variant == name else ClosureCheck.read(files.ablation_closure(name))
        for name in summary.closure_by_variant or {}
    }


def _variant_cell(check: ClosureCheck) -> str:
    if check.method == "lora":
        rows = "rows trained" if check.rows_trained else "rows frozen"
        return f"LoRA, init {check.init}, {rows}"
    return f"full, init {check.init}"


def rate_cell(check: ClosureCheck) -> str:
    low, high = check.interval
    return f"{check.rate:.2f} [{low:.2f}, {high:.2f}]"


def _norm_cell(diagnosis: ModelDiagnosis, token: str = "eot") -> str:
    value = diagnosis.row_norms.embedding.template.get(token)
    return "-" if value is None else f"{value:.2f}"


def _rank_cell(diagnosis: ModelDiagnosis) -> str:
    rank = diagnosis.eot_rank
    return f"{rank.median_rank:,} (top-1 {rank.top1:.0%})"


def _audit_norms(audit: TokenAudit) -> str:
    """What pretraining did to the rows: trained rows against the template rows and the start."""
    norms = audit.row_norms.embedding
    counts = {token.name: token.pretrain_count for token in audit.tokens}
    template = ", ".join(
        f"{name} {value:.2f} (seen {fmt(counts.get(name))} times)"
        for name, value in norms.template.items()
    )
    start = audit.row_norms.initial_norm
    pushed = ""
    if audit.tied and norms.template and min(norms.template.values()) > norms.ordinary_mean:
        pushed = (
            " The never-seen rows moved further than the trained ones: in a tied head the "
            "softmax pushes every row it never predicts away from the hidden states, and Adam "
            "steps a row by the learning rate however small its gradient."
        )
    return (
        f"\nAfter pretraining (the audit, embedding rows): trained rows' mean norm "
        f"{norms.ordinary_mean:.2f} (median {norms.ordinary_median:.2f})"
        + (f", from {start:.2f} at initialisation" if start is not None else "")
        + f"; template rows: {template}.{pushed}\n"
    )


def _ranks(check: ClosureCheck) -> str:
    """The end token's median rank at answer ends before -> after SFT."""
    return f"{_rank_cell(check.diagnosis.before)} → {_rank_cell(check.diagnosis.after)}"


def _failing_and_best(checks: dict[str, ClosureCheck]) -> tuple[str, str] | None:
    """(the variant that should fail, the best one that should not): the frozen-row variant that
    closed fewest against the best other; without frozen rows, full fine-tuning from `none`
    against the best initialised one."""
    frozen = [name for name, check in checks.items() if check.frozen]
    if not frozen:
        frozen = [name for name, check in checks.items() if check.init == "none"]
    others = [name for name in checks if name not in frozen]
    if not frozen or not others:
        return None
    worst = min(frozen, key=lambda name: checks[name].rate)
    return worst, max(others, key=lambda name: checks[name].rate)


def _counted(name: str, check: ClosureCheck) -> str:
    return f"`{name}` ended {check.closed} of {check.total} ({rate_cell(check)})"


def _why_frozen(name: str, check: ClosureCheck, trained_norm: float) -> str:
    """Why a frozen-row variant closed as many answers as it did, with its numbers."""
    norm = check.diagnosis.before.row_norms.embedding.template.get("eot")
    ranks = f"<|eot|>'s median rank at answer ends {_ranks(check)}"
    if check.init == "mean":
        return (
            f" {_counted(name, check)}: a row at the mean of the trained rows scores, for any "
            "hidden state, the mean of their logits, never the largest, so frozen there it is "
            f"never the greedy choice ({ranks})."
        )
    if check.init == "none" and norm is not None:
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


def _why_open(name: str, check: ClosureCheck) -> str:
    """What kept a variant whose rows trained from ending every answer: loops, with the end
    token's top-1 share where the reference answers end."""
    left = check.total - check.closed
    if left == 0:
        return ""
    top1 = check.diagnosis.after.eot_rank.top1
    return (
        f" `{name}` left {left} answers open, {check.unclosed_looping} of them loops (at "
        f"least half their 4-grams repeated, to the {check.max_new_tokens}-token limit); where "
        f"the reference answers end, <|eot|> is its first choice {top1:.0%} of the time."
    )


def _reproduced_or_not(checks: dict[str, ClosureCheck], failing: str, best_name: str) -> str:
    worst, best = checks[failing], checks[best_name]
    shortfall = best.rate - worst.rate
    rates = (
        f"{_counted(failing, worst)}, `{best_name}` {best.closed} of {best.total} "
        f"({rate_cell(best)})"
    )
    if shortfall >= CLOSURE_MARGIN:
        return (
            f"\n**The field's failure, reproduced:** {rates}, 95% intervals in brackets "
            f"({shortfall:.0%} fewer; the card counts a shortfall of {CLOSURE_MARGIN:.0%} or more)."
        )
    short = "at least as many" if shortfall <= 0 else f"a shortfall of {shortfall:.0%}"
    head = (
        f"\n**Not reproduced at demo size:** {rates}: {short}, under the "
        f"{CLOSURE_MARGIN:.0%} shortfall the card asks for."
    )
    if best.rate < 0.5:
        head += (
            " No variant taught this model to end most answers: this SFT is too short "
            "for any, so it cannot show what the rows add."
        )
    elif not worst.frozen:
        head += (
            " Full fine-tuning trains every row, the never-seen ones too: without "
            "initialisation this SFT still moved them as far as ending needs (LoRA with "
            "the rows frozen, `sft.compare`, is the setup that cannot)."
        )
    return head


def closure_verdict(checks: dict[str, ClosureCheck], audit: TokenAudit) -> str:
    """The field's failure reproduced or not, and why each frozen-row variant closed as it did,
    said with this run's numbers."""
    pair = _failing_and_best(checks)
    if pair is None:
        return ""
    head = _reproduced_or_not(checks, *pair)
    open_answers = "".join(
        _why_open(name, check) for name, check in checks.items() if not check.frozen
    )
    if open_answers:
        head += "\n\nWith the rows trained:" + open_answers
    trained_norm = audit.row_norms.embedding.ordinary_mean
    frozen = [(name, check) for name, check in checks.items() if check.frozen]
    why = "".join(_why_frozen(name, check, trained_norm) for name, check in frozen)
    if frozen:
        why = "\n\nWith the rows frozen (LoRA, `train_new_token_rows = false`):" + why
    return head + why + "\n"


def closure_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    summary = SftSummary.read_if_present(files.sft_summary)
    if summary is None or summary.closure_by_variant is None:
        return missing("sft")
    checks = closure_checks(files, summary)
    rows = [
        [
            name,
            _variant_cell(check),
            f"{check.closed} / {check.total}",
            rate_cell(check),
            _ranks(check),
            f"{_norm_cell(check.diagnosis.before)} → {_norm_cell(check.diagnosis.after)}",
        ]
        for name, check in checks.items()
    ]
    header = [
        "variant",
        "fine-tuning",
        "answers ending with <|eot|>",
        "closure rate [95% interval]",
        "<|eot|> median rank at answer ends, before → after SFT",
        "<|eot|> row norm, before → after SFT",
    ]
    out = [table(header, rows)]
    out.append(
        "\nRank: where a held-out reference answer ends, how many tokens' logits beat <|eot|>'s "
        "(0: greedy decoding ends the answer there). Before SFT: the pretrained model with the "
        "initialisation applied (LoRA's adapters start at zero). Intervals: Wilson's, over the "
        "held-out prompts. The first row is the run's chat model; the others are `sft.compare`'s "
        "variants, trained on the same data and steps.\n"
    )
    audit = TokenAudit.read(files.audit)
    out.append(_audit_norms(audit))
    out.append(
        "\nAfter SFT, trained rows' mean norm: "
        + ", ".join(
            f"{name} {check.diagnosis.after.row_norms.embedding.ordinary_mean:.2f}"
            for name, check in checks.items()
        )
        + ".\n"
    )
    untrained = ", ".join(audit.untrained_template_tokens) or "none"
    out.append(f"\nThe audit found these template tokens untrained before SFT: {untrained}.\n")
    out.append(closure_verdict(checks, audit))
    path = report_plots.grouped_bars(
        {"closure rate": {name: check.rate for name, check in checks.items()}},
        files.plots / "closure.png",
        ylabel="share of answers that end",
        ylim=(0, 1.05),
        intervals={"closure rate": {name: check.interval for name, check in checks.items()}},
    )
    out.append(f"\n![closure by variant]({path.relative_to(files.root)})\n")
    return "".join(out)
