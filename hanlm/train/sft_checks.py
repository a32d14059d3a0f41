"""What SFT checks around a training: the special-token audit of the model it starts from,
LoRA's settings, the variants that would leave the template rows untrained, the closure check
of a trained model with why its answers end or not, and the `sft.min_closure` gate."""

from __future__ import annotations

from pathlib import Path

from hanlm.chat import closure, tokens
from hanlm.config import Config, SftSection, SftVariant
from hanlm.console import warn
from hanlm.data import chat_data
from hanlm.errors import UserError
from hanlm.train import lora, pretrained
from hanlm.train.results import ClosureCheck, TokenAudit
from hanlm.train.sft import SftSource, initialise_rows, load_source_model, model_on_meta
from hanlm.train.sft_data import load_tokenizer


def audit(source: SftSource, special: dict) -> TokenAudit:
    """The special-token audit of the source model (printed as a table)."""
    model, problem = model_on_meta(source)
    if problem is None:  # the audit reads the token matrices only
        model = pretrained.with_token_matrices(model, source.kind, source.path)
    else:
        model, _ = load_source_model(source)
    report = tokens.audit(model, special, source.pretrain_counts, added=source.added_tokens)
    del model
    tokens.print_audit(report)
    return TokenAudit.model_validate({**report, "source": str(source.path)})


def diagnosis(model, tokenizer, heldout: list, special: dict) -> dict:
    """The template rows' norms and <|eot|>'s rank at the held-out answers' ends, for `model`."""
    eot = special["eot"]["id"]
    examples = [chat_data.tokenize(tokenizer, c["messages"], eot) for c in heldout]
    return {
        "row_norms": tokens.row_norms(model, special),
        "eot_rank": closure.end_of_answer_ranks(model, examples, end_of_turn_id=eot),
    }


def before_sft(
    cfg: Config, source: SftSource, audit: TokenAudit, special: dict, init: str, heldout
) -> dict:
    """The diagnosis of the source model as SFT starts it: initialised by `init`."""
    model, _ = load_source_model(source)
    initialise_rows(cfg, model, source, audit, special, init)
    tokenizer = load_tokenizer(source.tokenizer_dir)
    return diagnosis(model, tokenizer, heldout, special)


def closure_check(
    model,
    tokenizer,
    heldout: list,
    special: dict,
    sft_cfg: SftSection,
    variant: SftVariant,
    before: dict,
) -> ClosureCheck:
    """The closure check of the trained `model` of `variant` on the held-out prompts, with
    the diagnosis before (`before`) and after SFT."""
    check = closure.check(
        model,
        tokenizer,
        heldout,
        end_of_turn_id=special["eot"]["id"],
        pad_id=special["pad"]["id"],
        max_new_tokens=sft_cfg.closure_max_tokens,
        init=variant.init,
    )
    check.update({"variant": variant.name, "method": variant.method})
    if variant.method == "lora":
        check["rows_trained"] = variant.train_new_token_rows
    check["diagnosis"] = {"before": before, "after": diagnosis(model, tokenizer, heldout, special)}
    return ClosureCheck.model_validate(check)


def check_lora(cfg: Config, source: SftSource) -> None:
    """LoRA's settings against the source model and the precision, before any work."""
    variants = cfg.sft.variants()
    if not any(v.method == "lora" for v in variants):
        return
    if cfg.precision.mode in ("fp8", "fp8-emulate"):
        raise UserError(
            f"sft.method lora with precision.mode {cfg.precision.mode}: FP8 converts the linear "
            "layers LoRA wraps",
            fix="set precision.mode = bf16 (or fp32) for LoRA SFT",
        )
    model, _ = model_on_meta(source)
    lora.check_targets(model, cfg.sft.lora)


def guard_untrained_rows(variants: list[SftVariant], audit: TokenAudit) -> None:
    """The field's failure, caught: the template tokens are untrained and a variant will neither
    initialise nor train their rows (LoRA, rows frozen, init none). The SFT's own variant is
    refused; a compared one (a deliberate ablation) is warned about."""
    untrained = audit.untrained_template_tokens
    if not untrained:
        return
    names = ", ".join(untrained)
    fix = (
        "set sft.train_new_token_rows = true (LoRA then trains those rows alone) or sft.init = "
        "mean (they start where trained rows are)"
    )
    for position, variant in enumerate(variants):
        if variant.method != "lora" or variant.train_new_token_rows:
            continue
        if variant.rows_stay_untrained:
            what = (
                f"sft variant {variant.name}: the template tokens {names} were never trained, "
                "LoRA freezes their embedding rows and init none leaves them as pretraining did: "
                "the field's setup, where 0 of 50 answers ended"
            )
            if position == 0:
                raise UserError(what, fix=fix)
            warn(f"{what} (a compared variant: kept, to show it)")
        else:
            warn(
                f"sft variant {variant.name}: the template tokens {names} start initialised "
                f"({variant.init}) but LoRA freezes their rows: they never learn; "
                "sft.train_new_token_rows = true trains them"
            )


def gate(check: ClosureCheck, sft_cfg: SftSection, where: Path) -> None:
    """A closure below sft.min_closure stops the stage (after its files are written)."""
    if sft_cfg.min_closure > 0 and check.rate < sft_cfg.min_closure:
        raise UserError(
            f"the SFT model ended {check.closed} of {check.total} held-out answers with "
            f"{check.end_token} (closure {check.rate:.2f}), below sft.min_closure "
            f"{sft_cfg.min_closure}",
            where=str(where),
            fix="look at audit.json: initialise the untrained template tokens (--init mean), "
            "train longer (--max-steps) or raise sft.closure_max_tokens",
        )
