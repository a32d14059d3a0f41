"""The sft stage's work: the data and the audit once, then each variant trained and checked.

The run's own variant (`sft.init`, `sft.method`, ...) trains into RUN/sft/ and is exported and
checked; each of `sft.compare`'s variants trains on the same rows into RUN/sft/ablation/NAME/ and
is checked beside it. Every rank trains; rank 0 exports, checks and writes the results: the
audit (audit.json), the data report (data.json), each variant's closure check (closure.json) and
the summary with every variant's closure rate (summary.json). A closure below sft.min_closure
stops the stage once they are written. hanlm.train.sft trains one model; hanlm.train.sft_data
and hanlm.train.sft_checks make the rows and the checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hanlm import ranks
from hanlm.chat import tokens
from hanlm.config import Config, SftVariant
from hanlm.console import info
from hanlm.stages.rundir import SftDirs
from hanlm.train import checkpoint_layout, export, sft_checks, sft_data
from hanlm.train import sft as sft_lib
from hanlm.train.results import ClosureCheck, SftDataReport, SftSummary, TokenAudit

if TYPE_CHECKING:
    from hanlm.data.decontam.index import BenchmarkIndex


@dataclass(frozen=True)
class Prepared:
    """What every variant trains on and is checked with."""

    source: sft_lib.SftSource
    special: dict  # the template's and the tokenizer's special tokens (hanlm.chat.tokens)
    rows: dict  # the train and held-out token rows (hanlm.train.sft_data.chat_rows)
    heldout: list[dict]  # the held-out conversations the closure check asks
    audit: TokenAudit
    data: SftDataReport


def prepare(
    cfg: Config,
    source: sft_lib.SftSource,
    conversations: list[dict],
    sources: dict[str, dict],
    data_fp: str,
    index: BenchmarkIndex | None,
    out: SftDirs,
) -> Prepared:
    """The rows and the audit, after the checks that refuse a variant before any work; rank 0
    writes the audit and the data report."""
    sft_cfg = cfg.sft
    sft_checks.check_lora(cfg, source)
    conversations, contamination = sft_data.decontaminate(conversations, index, sft_cfg)
    train, heldout = sft_data.split_heldout(conversations, sft_cfg.heldout, cfg.run.seed)
    tokenizer = sft_data.load_tokenizer(source.tokenizer_dir)
    special = tokens.load_special_tokens(source.tokenizer_dir)
    eot, pad = special["eot"]["id"], special["pad"]["id"]
    rows, report, heldout = sft_data.chat_rows(tokenizer, train, heldout, sft_cfg, eot, pad)
    data = SftDataReport.model_validate(
        {**report, "sources": sources, "fingerprint": data_fp, "contamination": contamination}
    )
    audit = sft_checks.audit(source, special)
    sft_checks.guard_untrained_rows(sft_cfg.variants(), audit)  # refused: nothing written
    if ranks.is_main():
        audit.write(out.audit)
        data.write(out.data_report)
    return Prepared(source, special, rows, heldout, audit, data)


def _train(cfg: Config, prep: Prepared, variant: SftVariant, out: SftDirs, common: dict):
    return sft_lib.train_once(
        cfg,
        outputs=out,
        variant=variant,
        source=prep.source,
        audit=prep.audit,
        special=prep.special,
        rows=prep.rows,
        **common,
    )


def _check_exported(
    cfg: Config, prep: Prepared, trained, variant: SftVariant, out: SftDirs, before: dict
) -> ClosureCheck:
    """Rank 0: the run's own variant exported, and its export checked (what users will load)."""
    special = prep.special
    ends = [special["eot"]["id"], special["eod"]["id"]]
    adapters = sft_lib.adapters_of(cfg, variant, special)
    sft_lib.export_trained(out, trained.config, prep.source.tokenizer_dir, ends, adapters)
    model = export.load_exported(out.export)
    tokenizer = sft_data.load_tokenizer(out.export)
    return sft_checks.closure_check(
        model, tokenizer, prep.heldout, special, cfg.sft, variant, before
    )


def _check_compared(
    cfg: Config, prep: Prepared, trained, variant: SftVariant, out: SftDirs, before: dict
) -> ClosureCheck:
    """Rank 0: a compared variant's latest checkpoint checked (it is not exported)."""
    adapters = sft_lib.adapters_of(cfg, variant, prep.special)
    model = sft_lib.trained_model(
        checkpoint_layout.latest(out.checkpoints), trained.config, adapters
    )
    tokenizer = sft_data.load_tokenizer(prep.source.tokenizer_dir)
    return sft_checks.closure_check(
        model, tokenizer, prep.heldout, prep.special, cfg.sft, variant, before
    )


def fine_tune(cfg: Config, prep: Prepared, out: SftDirs, common: dict[str, Any]) -> SftSummary:
    """Every variant trained (every rank) and checked (rank 0); the summary, which rank 0 also
    writes (the other ranks know only the training's part). `common`: train_once's data
    fingerprint, settings fingerprint and force."""
    variants = cfg.sft.variants()
    main = variants[0]
    trained = _train(cfg, prep, main, out, common)
    result = trained.summary
    summary: dict[str, Any] = {
        "init": main.init,
        "method": main.method,
        "step": result["step"],
        "tokens": result["tokens"],
    }
    if "val_loss" in result:
        summary["val_loss"] = result["val_loss"]
    before = {}
    if trained.is_main:  # LoRA starts as the initialised source model: its adapters add zero
        for init in dict.fromkeys(v.init for v in variants):
            before[init] = sft_checks.before_sft(
                cfg, prep.source, prep.audit, prep.special, init, prep.heldout
            )
        main_check = _check_exported(cfg, prep, trained, main, out, before[main.init])
        main_check.write(out.closure)
        rate = f"{main_check.closed}/{main_check.total} ({main_check.rate:.2f})"
        info(f"sft: closure {rate} ({main.name})")
        by_variant = {main.name: main_check.rate}
    for other in variants[1:]:
        folder = out.ablation(other.name)
        compared = _train(cfg, prep, other, folder, common)
        if trained.is_main:
            check = _check_compared(cfg, prep, compared, other, folder, before[other.init])
            check.write(folder.closure)
            by_variant[other.name] = check.rate
            info(f"sft: ablation closure {check.closed}/{check.total} ({other.name})")
    if not trained.is_main:
        return SftSummary.model_validate(summary)
    summary.update(
        {
            "closure": {"closed": main_check.closed, "total": main_check.total,
                        "rate": main_check.rate},
            "closure_by_variant": by_variant,
            "untrained_template_tokens": prep.audit.untrained_template_tokens,
            "hf": str(out.export),
            "data": prep.data.model_dump(mode="json", exclude={"contamination"}),
            "contaminated_dropped": prep.data.contamination.get("dropped", 0),
        }
    )  # fmt: skip
    typed = SftSummary.model_validate(summary)
    typed.write(out.summary)
    sft_checks.gate(main_check, cfg.sft, out.closure)
    return typed
