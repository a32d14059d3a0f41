"""The pretrain stage: train (or resume) on the run's shards into pretrain/ (checkpoints,
metrics.jsonl, summary.json). Every rank runs it under torchrun; rank 0 writes the summary."""

from __future__ import annotations

from dataclasses import dataclass

from hanlm import ranks
from hanlm.config import Config
from hanlm.data import mixture
from hanlm.data.tokenizer import token_byte_lengths
from hanlm.stages import run_facts
from hanlm.stages.markers import stage_fingerprint
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import Stage, StageContext, Unfinished
from hanlm.train import pretrain as pretrain_lib
from hanlm.train.results import PretrainSummary

# What changes nothing pretraining computes: its bookkeeping, and when a diverging run gives up
# (a run that finished computed the same weights whatever it is)
NOT_COMPUTED = (*run_facts.TRAINING_BOOKKEEPING, "optimizer.max_nonfinite_steps")


@dataclass(frozen=True)
class PretrainOptions:
    """What `hanlm pretrain` asks of the stage beyond the recipe."""

    stop_after_steps: int | None = None  # stop (resumable) after this many steps of this run


def validate(cfg: Config, run: RunDir, options: PretrainOptions) -> None:
    """A mix of corpus sources that the shards cannot give within their max_epochs stops the
    stage before its folder is touched (the build checks the shards themselves)."""
    if run_facts.finished(run, "shards"):
        mixture.for_training(cfg, run.shards)


def build(ctx: StageContext) -> PretrainSummary | Unfinished:
    """The summary once the last step is checkpointed; Unfinished when it stopped before (its
    checkpoints are resumed next time)."""
    cfg, run = ctx.cfg, ctx.run
    manifest = run_facts.shards_manifest(run)
    if ranks.is_main():  # one reader hashes them; its refusal stops all
        run_facts.check_shards_intact(run)
    tokenizer = run_facts.tokenizer(run)
    data = pretrain_lib.PretrainData(
        shards_dir=run.shards,
        shards_fingerprint=stage_fingerprint(run.shards),
        vocab_size=manifest.vocab_size,
        tokenizer_sha256=manifest.tokenizer_sha256,
        tokenizer_dir=run.tokenizer,
        token_byte_lengths=token_byte_lengths(tokenizer),
    )
    out = run.pretrain
    summary = pretrain_lib.pretrain(
        cfg,
        data,
        out,
        settings_fp=ctx.fingerprint,
        force=ctx.force,
        stop_after_steps=ctx.options.stop_after_steps,
        on_complete=lambda summary: summary.write(out.summary),
    )
    return summary if summary.completed else Unfinished(summary)


STAGE = Stage(
    name="pretrain",
    options=PretrainOptions,
    version=1,
    output=lambda run: run.pretrain.root,
    result=PretrainSummary,
    reads=(
        "model",
        "pretrain",
        "optimizer",
        "precision",
        "parallel",
        "checkpoint",
        "logging",
        "distill",
        "corpus.sources",  # the shares of the mix the training draws (hanlm.data.mixture)
        "run.seed",
    ),
    unfingerprinted=NOT_COMPUTED,
    after=("tokenizer", "shards"),
    writes="in_place",
    all_ranks=True,
    logs_to_trackers=True,
    build=build,
    validate=validate,
)
