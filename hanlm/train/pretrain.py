"""`hanlm pretrain`: build the model, wrap it for the processes at hand, and run the loop.

Runs alone or under torchrun (`torchrun --nproc_per_node N -m hanlm pretrain --run DIR`); every
rank executes this same function and reads its slice of the shards.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

from hanlm.config import Config, PretrainSection
from hanlm.console import info, warn
from hanlm.data import shards as shards_stage
from hanlm.data import tokenizer as tokenizer_stage
from hanlm.data.loader import TokenLoader
from hanlm.errors import UserError
from hanlm.files import (
    atomic_write_json,
    fingerprint,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.plan.catalogue import device_peak_flops
from hanlm.train import checkpoint, distill, parallel, precision
from hanlm.train.optim import adamw
from hanlm.train.trainer import Schedule, Trainer, TrainerSettings

STAGE = "pretrain"


def accumulation_steps(p: PretrainSection, world_size: int) -> int:
    per_pass = p.seq_len * p.micro_batch * world_size
    if p.global_batch_tokens % per_pass:
        fitting = max(per_pass, round(p.global_batch_tokens / per_pass) * per_pass)
        raise UserError(
            f"pretrain.global_batch_tokens {p.global_batch_tokens:,} is not a multiple of "
            f"seq_len x micro_batch x ranks = {p.seq_len} x {p.micro_batch} x {world_size} = {per_pass:,}",
            fix=f"use --set pretrain.global_batch_tokens={fitting} or change micro_batch",
        )
    return p.global_batch_tokens // per_pass


def total_steps(p: PretrainSection) -> int:
    if p.max_steps is not None:
        return p.max_steps
    if p.max_tokens is not None:
        return max(1, math.ceil(p.max_tokens / p.global_batch_tokens))
    raise UserError(
        "pretraining needs a length",
        fix="give --max-steps N or --max-tokens N (or set them in the recipe)",
    )


def model_fingerprint(p: PretrainSection, shards_fp: str | None, seed: int) -> str:
    """What a checkpoint must match to be resumed: the model, the data and the seed."""
    return fingerprint("model", p.preset, p.seq_len, shards_fp, seed)


def stage_fp(cfg: Config, run_dir: Path) -> str:
    skip = {"resume", "log_every", "device"}
    return fingerprint(
        STAGE,
        cfg.pretrain.model_dump(exclude=skip),
        cfg.run.seed,
        stage_fingerprint(Path(run_dir) / "shards"),
        # only when on, so that runs without distillation keep their fingerprints
        *([cfg.distill.model_dump()] if cfg.distill.enabled else []),
    )


def run(
    cfg: Config, run_dir: Path, *, force: bool = False, stop_after_steps: int | None = None
) -> dict:
    from hanlm import model as model_lib

    run_dir = Path(run_dir)
    out = run_dir / STAGE
    p = cfg.pretrain
    fp = stage_fp(cfg, run_dir)
    if not force and stage_fingerprint(out) == fp:
        info(f"pretrain: up to date in {out}, skipped")
        return read_json(out / "summary.json")
    manifest = shards_stage.load_manifest(run_dir)
    steps = total_steps(p)
    d = parallel.init(p.device)
    try:
        plan = precision.resolve(p.precision, d.device, recipe=p.fp8_recipe)
        mode = parallel.resolve_mode(p.parallel, d)
        accumulation = accumulation_steps(p, d.world_size)
        if force or p.resume == "never":
            if d.is_main:
                shutil.rmtree(out / "checkpoints", ignore_errors=True)
                (out / "stage.json").unlink(missing_ok=True)
            parallel.barrier(d)

        mconfig = model_lib.model_config(
            p.preset, vocab_size=manifest["vocab_size"], seq_len=p.seq_len
        )
        model = model_lib.build_model(mconfig, seed=cfg.run.seed, device=d.device)
        converted = precision.apply_fp8(
            model, plan, fsdp_float8_all_gather=p.fsdp_float8_all_gather
        )
        model = parallel.parallelize(
            model,
            d,
            mode,
            compute_dtype=plan.compute_dtype,
            activation_checkpointing=p.activation_checkpointing,
            compile_blocks=p.compile,
        )
        optimizer = adamw(
            model,
            lr=p.lr,
            weight_decay=p.weight_decay,
            betas=(p.beta1, p.beta2),
            eps=p.eps,
            device=d.device,
        )
        sha = manifest["tokenizer_sha256"]
        shards_dir = run_dir / "shards"
        common = {
            "seq_len": p.seq_len,
            "micro_batch": p.micro_batch,
            "rank": d.rank,
            "world_size": d.world_size,
        }
        train_loader = TokenLoader.from_shards(
            shards_dir, "train", seed=cfg.run.seed, expected_tokenizer_sha256=sha, **common
        )
        val_loader = None
        try:
            val_loader = TokenLoader.from_shards(
                shards_dir, "val", expected_tokenizer_sha256=sha, **common
            )
        except UserError as e:  # too little validation text is no reason to stop training
            if d.is_main:
                warn(f"pretrain: no validation: {e.what}")
        tok = tokenizer_stage.load(run_dir)
        token_bytes = torch.tensor(tokenizer_stage.token_byte_lengths(tok), dtype=torch.float64)

        flops = model_lib.flops_per_token(mconfig, p.seq_len)["total"]
        peak, peak_source = device_peak_flops(d.device, p.precision)
        settings = TrainerSettings(
            accumulation=accumulation,
            grad_clip=p.grad_clip,
            log_every=p.log_every,
            eval_every=p.eval_every,
            eval_batches=p.eval_batches,
            checkpoint_every=p.checkpoint_every,
            flops_per_token=flops,
            peak_flops=peak,
            fingerprint=model_fingerprint(p, stage_fingerprint(shards_dir), cfg.run.seed),
            settings=fp,
        )
        schedule = Schedule(
            steps, p.lr, p.warmup_steps, p.min_lr_ratio, p.schedule, p.decay_fraction
        )

        def after_step() -> None:
            precision.precompute_fp8_scales_if_needed(model, plan, p.fsdp_float8_all_gather)

        c = cfg.checkpoint
        policy = checkpoint.Policy(**c.model_dump(exclude={"every_minutes"}))
        trainer = Trainer(
            model=model,
            optimizer=optimizer,
            train_loader=train_loader,
            val_loader=val_loader,
            schedule=schedule,
            settings=settings,
            dist=d,
            mode=mode,
            plan=plan,
            out_dir=out,
            token_bytes=token_bytes,
            after_optimizer_step=after_step,
            checkpoints=checkpoint.CheckpointManager(out / "checkpoints", d, policy),
            every_minutes=c.every_minutes,
            loss_fn=distill.make_loss_fn(
                cfg.distill,
                mconfig.get_text_config().vocab_size,
                d.device,
                student_tokenizer=run_dir / tokenizer_stage.STAGE,
            ),
        )
        if p.resume == "auto" and not force:  # forced: never back from the mirror either
            trainer.resume()
        if d.is_main:
            info(
                f"pretrain: {model_lib.describe(mconfig)}; {precision.describe(plan)}; {mode} on "
                f"{d.world_size} x {d.device.type}; {steps} steps of {p.global_batch_tokens:,} tokens "
                f"({accumulation} micro-steps); fp8 layers: {len(converted)}; MFU peak: {peak_source}"
            )
        result = trainer.fit(stop_after_steps=stop_after_steps)
        summary = {**result, "total_steps": steps, "world_size": d.world_size, "mode": mode}
        if d.is_main and result["completed"]:
            atomic_write_json(out / "summary.json", summary)
            write_stage_marker(out, STAGE, fp)
        parallel.barrier(d)
        return summary
    finally:
        parallel.shutdown(d)
