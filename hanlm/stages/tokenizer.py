"""The tokenizer stage: a BPE tokenizer trained on the run's training corpus into
`RUN/tokenizer/` (see hanlm.data.tokenizer)."""

from __future__ import annotations

from pathlib import Path

from hanlm.console import info
from hanlm.data import tokenizer
from hanlm.stages.corpus import checked_corpus, training_corpus_dir
from hanlm.stages.rundir import RunDir, finished_output
from hanlm.stages.stage import Stage, StageContext

STAGE = Stage(
    name="tokenizer",
    version=1,
    output=lambda run: run.tokenizer,
    result=tokenizer.TokenizerStats,
    reads=("tokenizer", "run.seed"),
    after=("corpus", "decontam"),  # the decontaminated corpus when that stage wrote one
)


def damage(run: RunDir) -> str | None:
    return tokenizer.damage(run.tokenizer)


def build(ctx: StageContext) -> tokenizer.TokenizerStats:
    corpus_dir = checked_corpus(ctx.run, training_corpus_dir(ctx.run))
    stats = tokenizer.build(corpus_dir, ctx.cfg, ctx.out)
    heldout = stats.heldout
    info(
        f"tokenizer: {stats.vocab_size:,} tokens; held-out {heldout.chars_per_token} "
        f"chars/token, {heldout.bytes_per_token} bytes/token -> {ctx.run.tokenizer}"
    )
    return stats


def finished_path(run: RunDir | Path) -> Path:
    """The run's tokenizer.json; a UserError when the tokenizer stage has not finished."""
    run = RunDir.of(run)
    fix = f"run `hanlm tokenizer --run {run.root}` first"
    return finished_output(run.tokenizer_json, "tokenizer", fix)


def load(run: RunDir | Path):
    """The run's trained tokenizer as a `tokenizers.Tokenizer`."""
    return tokenizer.load(finished_path(run))
