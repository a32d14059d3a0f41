"""The pretrain stage: skip when finished with the same settings, else train (or resume) on the
run's shards into pretrain/ (checkpoints, metrics.jsonl, summary.json).

Every rank runs it under torchrun; rank 0 writes the summary and the stage marker.
"""

from __future__ import annotations

import os
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.data.tokenizer import token_byte_lengths
from hanlm.files import (
    STAGE_MARKER,
    atomic_write_json,
    fingerprint,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.stages import shards as shards_stage
from hanlm.stages import tokenizer as tokenizer_stage
from hanlm.stages.rundir import RunDir
from hanlm.train import precision, trackers
from hanlm.train import pretrain as pretrain_lib

STAGE = "pretrain"
_NEW_OFF = {"document_masking"}  # keys added later, fingerprinted only when not at their default
# Only decides whether a diverging run stops: a run that finished computed the same weights
# whatever its value, so changing it neither redoes a finished run nor orphans its checkpoints.
_NOT_FINGERPRINTED_OPTIMIZER = {"max_nonfinite_steps"}


def fingerprinted_settings(cfg: Config) -> dict:
    """The settings pretraining's fingerprint covers, under the names they had when they were
    all [pretrain] keys, so that run directories made before the config was split by
    component are still recognised as finished (and their checkpoints as resumable)."""
    o, par, log = cfg.optimizer, cfg.parallel, cfg.logging
    return {
        "preset": cfg.model.preset,
        # document_masking only when on, so that runs made before it keep their fingerprints
        **cfg.pretrain.model_dump(exclude=None if cfg.pretrain.document_masking else _NEW_OFF),
        **o.model_dump(exclude=_NOT_FINGERPRINTED_OPTIMIZER),
        "precision": cfg.precision.mode,
        "fp8_recipe": cfg.precision.fp8_recipe,
        "fsdp_float8_all_gather": par.fsdp_float8_all_gather,
        "parallel": par.mode,
        "activation_checkpointing": par.activation_checkpointing,
        # what the run does: unset is off but for fp8, so older run dirs keep their fingerprints
        "compile": precision.compile_choice(cfg.precision.mode, par.compile).enabled,
        "eval_every": log.eval_every,
        "eval_batches": log.eval_batches,
        "checkpoint_every": cfg.checkpoint.every,
    }  # not resume, log_every or device: they change nothing the run computes


def stage_fp(cfg: Config, run: RunDir) -> str:
    return fingerprint(
        STAGE,
        fingerprinted_settings(cfg),
        cfg.run.seed,
        stage_fingerprint(run.shards),
        # only when on, so that runs without distillation keep their fingerprints
        *([cfg.distill.model_dump()] if cfg.distill.enabled else []),
    )


def run(
    cfg: Config, run: RunDir | Path, *, force: bool = False, stop_after_steps: int | None = None
) -> dict:
    run = run if isinstance(run, RunDir) else RunDir(run)
    out = run.pretrain
    fp = stage_fp(cfg, run)
    if not force and stage_fingerprint(out.root) == fp:
        info(f"pretrain: up to date in {out.root}, skipped")
        return read_json(out.summary)
    trackers.check(cfg.logging)  # on every rank, before the model is built
    manifest = shards_stage.load_manifest(run.root)
    if os.environ.get("RANK", "0") == "0":  # one reader hashes them; its refusal stops all
        shards_stage.check_intact(run)
    tokenizer = tokenizer_stage.load(run.root)
    data = pretrain_lib.PretrainData(
        shards_dir=run.shards,
        shards_fingerprint=stage_fingerprint(run.shards),
        vocab_size=manifest["vocab_size"],
        tokenizer_sha256=manifest["tokenizer_sha256"],
        tokenizer_dir=run.tokenizer,
        token_byte_lengths=token_byte_lengths(tokenizer),
    )

    def commit(summary: dict) -> None:
        atomic_write_json(out.summary, summary)
        write_stage_marker(out.root, STAGE, fp)

    return pretrain_lib.pretrain(
        cfg,
        data,
        out,
        settings_fp=fp,
        force=force,
        stop_after_steps=stop_after_steps,
        on_complete=commit,
        discard_on_fresh_start=(out.root / STAGE_MARKER,),
    )
