"""The tokenizer stage: a BPE tokenizer trained on the run's training corpus into
`RUN/tokenizer/` (see hanlm.data.tokenizer)."""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.data import base_tokenizer, tokenizer
from hanlm.files import file_sha256
from hanlm.model_folder import check_model_folder
from hanlm.stages.run_facts import checked_corpus, training_corpus_dir
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext


def damage(run: RunDir) -> str | None:
    return tokenizer.damage(run.tokenizer)


def validate(cfg: Config, run: RunDir, options: NoOptions) -> None:
    """The model whose tokenizer continued pretraining keeps must be there and loadable."""
    if cfg.model.init_from:
        from hanlm.inference import load_tokenizer  # deferred: transformers, for init_from only

        load_tokenizer(base_model(cfg))


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> list:
    """Continued pretraining: the model's tokenizer files by content."""
    if not cfg.model.init_from:
        return []
    base = base_model(cfg)
    return [
        file_sha256(f) for f in sorted(base.glob("tokenizer*.json")) + sorted(base.glob("*.jinja"))
    ]


def build(ctx: StageContext) -> tokenizer.TokenizerStats:
    corpus_dir = checked_corpus(ctx.run, training_corpus_dir(ctx.run))
    if ctx.cfg.model.init_from:
        base = base_model(ctx.cfg)
        stats = base_tokenizer.adopt(base, corpus_dir, ctx.cfg, ctx.out)
        before = stats.heldout_before
        grown = (
            f"; {stats.added_tokens:,} tokens added ({ctx.cfg.tokenizer.extend_init} rows): "
            f"held-out {before.chars_per_token} -> {stats.heldout.chars_per_token} chars/token"
            if stats.added_tokens
            else f"; held-out {stats.heldout.chars_per_token} chars/token"
        )
        info(f"tokenizer: {base}'s own, {stats.vocab_size:,} tokens{grown} -> {ctx.run.tokenizer}")
        return stats
    stats = tokenizer.build(corpus_dir, ctx.cfg, ctx.out)
    heldout = stats.heldout
    info(
        f"tokenizer: {stats.vocab_size:,} tokens; held-out {heldout.chars_per_token} "
        f"chars/token, {heldout.bytes_per_token} bytes/token -> {ctx.run.tokenizer}"
    )
    return stats


def base_model(cfg: Config) -> Path:
    """The folder of `model.init_from` (a Hub id: its snapshot in the Hub cache)."""
    return check_model_folder(cfg.model.init_from)


STAGE = Stage(
    name="tokenizer",
    version=1,
    output=lambda run: run.tokenizer,
    result=tokenizer.TokenizerStats,
    reads=("tokenizer", "model.init_from", "run.seed"),
    after=("corpus", "decontam"),  # the decontaminated corpus when that stage wrote one,
    build=build,
    validate=validate,
    inputs=inputs,
    damage=damage,
)
