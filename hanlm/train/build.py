"""The Trainer assembled once, for pretraining and SFT alike.

Each config component builds its part: [optimizer] the AdamW and its schedule, [checkpoint] the
checkpoint manager, [logging] the loop's cadence, [distill] the loss; [parallel] starts the
processes. A stage module hands over what is its own (the model, the loaders, the step count,
the fingerprints and the output paths) and gets a Trainer ready to resume and fit.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from hanlm.config import CheckpointSection, DistillSection, LoggingSection, OptimizerSection
from hanlm.train import checkpoint, distill, parallel
from hanlm.train.optim import adamw
from hanlm.train.trainer import Schedule, Trainer, TrainerSettings


def build_optimizer(section: OptimizerSection, model: torch.nn.Module, device) -> torch.optim.AdamW:
    return adamw(
        model,
        lr=section.lr,
        weight_decay=section.weight_decay,
        betas=(section.beta1, section.beta2),
        eps=section.eps,
        device=device,
    )


def build_schedule(section: OptimizerSection, total_steps: int) -> Schedule:
    return Schedule(
        total_steps,
        section.lr,
        section.warmup_steps,
        section.min_lr_ratio,
        section.schedule,
        section.decay_fraction,
    )


def build_checkpoints(
    section: CheckpointSection, root: Path, d: parallel.Dist
) -> checkpoint.CheckpointManager:
    policy = checkpoint.Policy(**section.model_dump(include=CheckpointSection.POLICY_KEYS))
    return checkpoint.CheckpointManager(root, d, policy)


@contextlib.contextmanager
def processes(device: str) -> Iterator[parallel.Dist]:
    """This process's place among the ranks (a process group under torchrun), left at the end."""
    d = parallel.init(device)
    try:
        yield d
    finally:
        parallel.shutdown(d)


def start_fresh(d: parallel.Dist, paths: list[Path]) -> None:
    """Remove an earlier training's checkpoints and records (on rank 0) before training anew."""
    if d.is_main:
        for path in paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    parallel.barrier(d)


@dataclass(frozen=True)
class TrainingJob:
    """What a training stage brings that the config sections do not say."""

    total_steps: int
    accumulation: int
    train_loader: object
    val_loader: object | None
    checkpoints_dir: Path
    metrics_path: Path
    flops_per_token: float
    peak_flops: float
    fingerprint: str  # model and data: a checkpoint must match it to be resumed
    settings: str  # every setting of the stage: a finished run with other ones is not reused
    student_tokenizer: Path  # distillation checks the teacher's vocabulary against it
    token_bytes: torch.Tensor | None = None
    after_optimizer_step: Callable[[], None] | None = None
    configure_optimizer: Callable[[torch.optim.Optimizer], None] | None = None


def build_trainer(
    model: torch.nn.Module,
    job: TrainingJob,
    *,
    d: parallel.Dist,
    mode: str,
    plan,
    optimizer: OptimizerSection,
    checkpoints: CheckpointSection,
    logging: LoggingSection,
    distillation: DistillSection,
) -> Trainer:
    """The Trainer of a model already placed and parallelised, from its components' sections."""
    adam = build_optimizer(optimizer, model, d.device)
    if job.configure_optimizer is not None:
        job.configure_optimizer(adam)
    settings = TrainerSettings(
        accumulation=job.accumulation,
        grad_clip=optimizer.grad_clip,
        **logging.model_dump(),
        checkpoint_every=checkpoints.every,
        flops_per_token=job.flops_per_token,
        peak_flops=job.peak_flops,
        fingerprint=job.fingerprint,
        settings=job.settings,
    )
    vocab_size = parallel.unwrap(model).config.get_text_config().vocab_size
    return Trainer(
        model=model,
        optimizer=adam,
        train_loader=job.train_loader,
        val_loader=job.val_loader,
        schedule=build_schedule(optimizer, job.total_steps),
        settings=settings,
        dist=d,
        mode=mode,
        plan=plan,
        metrics_path=job.metrics_path,
        token_bytes=job.token_bytes,
        after_optimizer_step=job.after_optimizer_step,
        checkpoints=build_checkpoints(checkpoints, job.checkpoints_dir, d),
        every_minutes=checkpoints.every_minutes,
        # distillation, when enabled, applies to SFT as to pretraining
        loss_fn=distill.make_loss_fn(
            distillation, vocab_size, d.device, student_tokenizer=job.student_tokenizer
        ),
    )
