"""The shards stage: the training corpus tokenised into `RUN/shards/` (see hanlm.data.shards).

The encoding runs on the data engine in `RUN/shards.work/`, kept while the settings and inputs
stay the same: a run killed part-way resumes there, encoding only the parts whose task had not
finished. Bad input (a UserError) throws the work away, since the input must change first.
"""

from __future__ import annotations

from hanlm.console import info
from hanlm.data import shards
from hanlm.files import file_sha256
from hanlm.stages import data_jobs
from hanlm.stages.run_facts import (
    ENGINE_PLACEMENT,
    checked_corpus,
    tokenizer_path,
    training_corpus_dir,
)
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import Stage, StageContext


def damage(run: RunDir) -> str | None:
    problems = shards.damaged_outputs(run.shards)
    return "; ".join(problems[:3]) if problems else None


def build(ctx: StageContext) -> shards.ShardsManifest | None:
    """The shards' manifest; None when the tasks were submitted to a cluster and still run."""
    cfg, run = ctx.cfg, ctx.run
    tokenizer_json = tokenizer_path(run)
    sha = file_sha256(tokenizer_json)
    corpus_dir = checked_corpus(run, training_corpus_dir(run))
    work = ctx.work  # Stage.work, made ready by the pipeline
    manifest = data_jobs.run_jobs(
        "shards", work, lambda: shards.encode_corpus(
            corpus_dir, tokenizer_json, sha, cfg.shards, cfg.run.seed, cfg.data_engine, work,
            ctx.out,
        ), what="shards",
    )  # fmt: skip
    if manifest is None:
        return None
    train = manifest.splits["train"]
    info(
        f"shards: {train.tokens:,} train tokens in {train.documents:,} documents, "
        f"{manifest.splits['val'].tokens:,} val tokens ({manifest.dtype}) -> {run.shards}"
    )
    return manifest


STAGE = Stage(
    name="shards",
    version=3,  # 3: a document index beside each token file (provenance)
    output=lambda run: run.shards,
    result=shards.ShardsManifest,
    reads=("shards", "data_engine", "run.seed"),
    # how the encoding is batched changes no token (see data.shards._encoded)
    unfingerprinted=("shards.batch_docs", "shards.piece_chars", *ENGINE_PLACEMENT),
    after=("corpus", "decontam", "tokenizer"),
    work=lambda run: run.shards_work,
    build=build,
    damage=damage,
)
