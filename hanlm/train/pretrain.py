"""Pretraining: build the model, wrap it for the processes at hand, and run the loop.

Runs alone or under torchrun (`torchrun --nproc_per_node N -m hanlm pretrain --run-dir DIR`); every
rank executes `pretrain` and reads its slice of the shards. The stage (hanlm.stages.pretrain)
decides whether to train and where; this module takes its inputs and outputs as paths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from hanlm import model as model_lib
from hanlm import model_folder, model_init
from hanlm.config import EPOCHS_WARNING, Config, PretrainSection
from hanlm.console import info, warn
from hanlm.data import mixture as mixture_lib
from hanlm.data.loader import TokenLoader
from hanlm.data.mixture import Mixture
from hanlm.errors import UserError
from hanlm.files import fingerprint
from hanlm.train import document_attention, init_from, parallel, precision
from hanlm.train.build import (
    Components,
    Placement,
    TrainingJob,
    build_trainer,
    mfu_peak,
    processes,
    start_fresh,
)
from hanlm.train.results import PretrainSummary


def accumulation_steps(pretrain_cfg: PretrainSection, world_size: int) -> int:
    per_pass = pretrain_cfg.seq_len * pretrain_cfg.micro_batch * world_size
    if pretrain_cfg.global_batch_tokens % per_pass:
        fitting = max(per_pass, round(pretrain_cfg.global_batch_tokens / per_pass) * per_pass)
        raise UserError(
            f"pretrain.global_batch_tokens {pretrain_cfg.global_batch_tokens:,} is not a multiple of "
            f"seq_len x micro_batch x ranks = {pretrain_cfg.seq_len} x {pretrain_cfg.micro_batch} x {world_size} = {per_pass:,}",
            fix=f"use --set pretrain.global_batch_tokens={fitting} or change micro_batch",
        )
    return pretrain_cfg.global_batch_tokens // per_pass


def total_steps(pretrain_cfg: PretrainSection) -> int:
    steps = pretrain_cfg.steps()
    if steps is not None:
        return steps
    raise UserError(
        "pretraining needs a length",
        fix="give --max-steps N or --max-tokens N (or set them in the recipe)",
    )


def model_fingerprint(cfg: Config, shards_fp: str | None) -> str:
    """What a checkpoint must match to be resumed: the model, the data and the seed."""
    model = cfg.model.init_from or cfg.model.preset
    return fingerprint("model", model, cfg.pretrain.seq_len, shards_fp, cfg.run.seed)


@dataclass(frozen=True)
class PretrainData:
    """The run's tokenised data: its shards and the tokenizer that made them."""

    shards_dir: Path
    shards_fingerprint: str | None
    vocab_size: int
    tokenizer_sha256: str
    tokenizer_dir: Path
    token_byte_lengths: list[int]


class PretrainOutputs(Protocol):
    """Where one pretraining writes (hanlm.stages.rundir.TrainingDirs is one), as SftOutputs
    is for SFT."""

    checkpoints: Path
    metrics: Path
    place: str  # its checkpoints' folder under [checkpoint] mirror


def describe_mixture(mix: Mixture) -> str:
    return "; ".join(
        f"{s.name} {s.drawn / mix.total:.1%} ({s.drawn * mix.seq_len:,} tokens, "
        f"{s.epochs:.2f} epochs)"
        for s in mix.sources
    )


def _loaders(
    cfg: Config, data: PretrainData, dist: parallel.Dist, mixture: Mixture | None
) -> tuple[TokenLoader, TokenLoader | None]:
    pretrain_cfg = cfg.pretrain
    common = {
        "seq_len": pretrain_cfg.seq_len,
        "micro_batch": pretrain_cfg.micro_batch,
        "rank": dist.rank,
        "world_size": dist.world_size,
        "expected_tokenizer_sha256": data.tokenizer_sha256,
        "document_masking": pretrain_cfg.document_masking,
    }
    train_loader = TokenLoader.from_shards(
        data.shards_dir, "train", seed=cfg.run.seed, mixture=mixture, **common
    )
    try:
        val_loader = TokenLoader.from_shards(data.shards_dir, "val", **common)
    except UserError as e:  # too little validation text is no reason to stop training
        val_loader = None
        if dist.is_main:
            warn(f"pretrain: no validation: {e.what}")
    return train_loader, val_loader


def _built_model(cfg: Config, vocab_size: int, at: Placement, tokenizer_dir: Path | None = None):
    """(the model config, the model converted to FP8 where asked and parallelised, the names
    of the layers converted): new, or with the weights of `model.init_from`."""
    par = cfg.parallel
    mconfig = model_lib.run_model_config(
        cfg.model, vocab_size=vocab_size, seq_len=cfg.pretrain.seq_len
    )
    if cfg.model.init_from:
        return _continued_model(cfg, mconfig, at, tokenizer_dir)
    model, meta_init = _new_model(mconfig, cfg.run.seed, at)
    if cfg.pretrain.document_masking:
        document_attention.prepare(
            model, at.dist.device, par.document_attention, setting="pretrain.document_masking"
        )
    converted = precision.apply_fp8(
        model, at.numerics, fsdp_float8_all_gather=par.fsdp_float8_all_gather
    )
    model = parallel.parallelize(
        model,
        at.dist,
        at.mode,
        compute_dtype=at.numerics.compute_dtype,
        activation_checkpointing=par.activation_checkpointing,
        compile_blocks=precision.blocks_compiled(
            at.numerics, par.compile, announce=at.dist.is_main
        ),
    )
    if meta_init is not None:  # sharded: each rank now allocates and fills its shards only
        model_init.materialise(
            parallel.unwrap(model),
            meta_init,
            seed=cfg.run.seed,
            device=at.dist.device,
            store=parallel.write_full_value,
            root=model,
        )
    return mconfig, model, converted


def _continued_model(cfg: Config, mconfig, at: Placement, tokenizer_dir: Path):
    """`_built_model` for continued pretraining (hanlm.train.init_from)."""
    par = cfg.parallel
    converted: list[str] = []

    def to_fp8(module) -> None:
        converted[:] = precision.apply_fp8(
            module, at.numerics, fsdp_float8_all_gather=par.fsdp_float8_all_gather
        )

    def prepare(model) -> None:
        if cfg.pretrain.document_masking:
            document_attention.prepare(
                model, at.dist.device, par.document_attention, setting="pretrain.document_masking"
            )

    options = {
        "compute_dtype": at.numerics.compute_dtype,
        "compile_blocks": precision.blocks_compiled(
            at.numerics, par.compile, announce=at.dist.is_main
        ),
        "activation_checkpointing": par.activation_checkpointing,
        "convert": to_fp8,
    }
    base = model_folder.check_model_folder(cfg.model.init_from)
    model = init_from.placed(
        base, mconfig, tokenizer_dir, at.dist, at.mode, prepare=prepare, options=options
    )
    return mconfig, model, converted


def _new_model(mconfig, seed: int, at: Placement):
    """(the model, how to initialise it once sharded): under FSDP built on the meta device,
    so no rank ever holds the whole model; otherwise built whole (DDP and one process need
    it whole anyway). Both give the same weights for the same seed."""
    if at.mode == "fsdp":
        model, meta_init = model_init.build_on_meta(mconfig)
        if meta_init.unsupported is None:
            return model, meta_init
        if at.dist.is_main:
            warn(
                f"pretrain: building the whole model on every rank before sharding: "
                f"its initialisation cannot be replayed shard by shard ({meta_init.unsupported})"
            )
    return model_lib.build_model(mconfig, seed=seed, device=at.dist.device), None


def _attention(model) -> str:
    return parallel.unwrap(model).config._attn_implementation


def pretrain(
    cfg: Config,
    data: PretrainData,
    outputs: PretrainOutputs,
    *,
    settings_fp: str,
    force: bool = False,
    stop_after_steps: int | None = None,
    on_complete: Callable[[PretrainSummary], None] | None = None,
) -> PretrainSummary:
    """Train (or resume) the recipe's model on the shards; `on_complete(summary)` runs on rank 0
    once the last step is checkpointed, before the ranks part. A fresh start (force, or
    checkpoint.resume never) deletes the checkpoints."""
    pretrain_cfg, par = cfg.pretrain, cfg.parallel
    steps = total_steps(pretrain_cfg)
    mixture = mixture_lib.for_training(cfg, data.shards_dir)  # an unmet share: before any work
    with processes(par.device, par.timeout_s) as dist:
        numerics = precision.resolve(
            cfg.precision.mode, dist.device, recipe=cfg.precision.fp8_recipe
        )
        mode = parallel.resolve_mode(par.mode, dist)
        accumulation = accumulation_steps(pretrain_cfg, dist.world_size)
        if force or cfg.checkpoint.resume == "never":
            start_fresh(dist, [outputs.checkpoints])

        mconfig, model, converted = _built_model(
            cfg, data.vocab_size, Placement(dist, mode, numerics), data.tokenizer_dir
        )
        train_loader, val_loader = _loaders(cfg, data, dist, mixture)

        def after_step() -> None:
            precision.precompute_fp8_scales_if_needed(model, numerics, par.fsdp_float8_all_gather)

        job = TrainingJob(
            total_steps=steps,
            accumulation=accumulation,
            train_loader=train_loader,
            val_loader=val_loader,
            checkpoints_dir=outputs.checkpoints,
            checkpoints_place=outputs.place,
            metrics_path=outputs.metrics,
            flops_per_token=model_lib.flops_per_token(mconfig, pretrain_cfg.seq_len)["total"],
            fingerprint=model_fingerprint(cfg, data.shards_fingerprint),
            settings=settings_fp,
            student_tokenizer=data.tokenizer_dir,
            token_bytes=torch.tensor(data.token_byte_lengths, dtype=torch.float64),
            after_optimizer_step=after_step,
        )
        placement = Placement(dist, mode, numerics)
        trainer = build_trainer(model, job, placement, Components.pretraining(cfg))
        if cfg.checkpoint.resume == "auto" and not force:  # forced: never back from the mirror
            trainer.resume()
        if dist.is_main:
            info(
                f"pretrain: {model_lib.describe(mconfig)}; {precision.describe(numerics)}; {mode} on "
                f"{dist.world_size} x {dist.device.type}; {steps} steps of {pretrain_cfg.global_batch_tokens:,} tokens "
                f"({accumulation} micro-steps); fp8 layers: {len(converted)}; MFU peak: {mfu_peak(placement)[1]}"
                + (f"; {torch.get_num_threads()} CPU threads" if dist.device.type == "cpu" else "")
                + (
                    f"; documents masked apart ({_attention(model)})"
                    if pretrain_cfg.document_masking
                    else ""
                )
            )
            if mixture is not None:
                info(f"pretrain: the mix per pass of {mixture.total:,} windows: "
                     + describe_mixture(mixture))  # fmt: skip
                for s in mixture.over_warning():
                    warn(
                        f"pretrain: source {s.name!r} is read {s.epochs:.1f} times; past "
                        f"~{EPOCHS_WARNING:g} epochs repeated tokens are worth much less than "
                        "new ones (Muennighoff et al. 2023)"
                    )
        result = trainer.fit(stop_after_steps=stop_after_steps)
        summary = {**result, "total_steps": steps, "world_size": dist.world_size, "mode": mode}
        if mixture is not None:
            summary["mixture"] = mixture.rows()
        if dist.device.type == "cpu":  # the weights' last bits depend on it (train/threads.py)
            summary["cpu_threads"] = torch.get_num_threads()
        summary = PretrainSummary.model_validate(summary)
        if dist.is_main and summary.completed and on_complete is not None:
            on_complete(summary)
        parallel.barrier(dist)
        return summary
