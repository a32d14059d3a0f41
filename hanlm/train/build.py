"""The Trainer assembled once, for pretraining and SFT alike.

Each config component builds its part: [optimizer] the AdamW and its schedule, [checkpoint] the
checkpoint manager, [logging] the loop's cadence and the trackers, [distill] and [parallel]'s loss keys the loss;
[parallel] starts the processes. A training hands over what is its own (the model, placed and
parallelised, the loaders, the step count, the fingerprints and the output paths) and gets a
Trainer ready to resume and fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from hanlm.config import (
    CheckpointSection,
    Config,
    DistillSection,
    LoggingSection,
    OptimizerSection,
    ParallelSection,
)
from hanlm.console import info
from hanlm.plan.catalogue import device_peak_flops
from hanlm.train import checkpoint_mirror, distill, muon, parallel, trackers
from hanlm.train.checkpoint_layout import Policy
from hanlm.train.checkpoint_manager import CheckpointManager
from hanlm.train.loss import TokenLoss
from hanlm.train.optim import adamw, adamw_over
from hanlm.train.precision import Numerics
from hanlm.train.preemption import Preempted, PreemptionWatch
from hanlm.train.trainer import Schedule, Trainer, TrainerSettings


@dataclass(frozen=True)
class Components:
    """The config sections a training is assembled from."""

    optimizer: OptimizerSection
    checkpoint: CheckpointSection
    logging: LoggingSection
    distill: DistillSection
    parallel: ParallelSection = dataclasses.field(default_factory=ParallelSection)  # the loss's
    stage: str = "pretrain"  # the trackers' job type
    config: dict = dataclasses.field(default_factory=dict)  # the resolved config, for trackers

    @classmethod
    def pretraining(cls, cfg: Config) -> Components:
        sections = (cfg.optimizer, cfg.checkpoint, cfg.logging, cfg.distill, cfg.parallel)
        return cls(*sections, stage="pretrain", config=_resolved(cfg))

    @classmethod
    def sft(cls, cfg: Config) -> Components:
        # [checkpoint] says how checkpoints are written and kept; [sft.checkpoint] how often;
        # likewise [logging] where the records go and [sft.logging] how often
        cadence = cfg.sft.checkpoint.model_dump()
        checkpoints = cfg.checkpoint.model_copy(update=cadence)
        logging = cfg.logging.model_copy(update=cfg.sft.logging.model_dump())
        sections = (cfg.sft.optimizer, checkpoints, logging, cfg.distill, cfg.parallel)
        return cls(*sections, stage="sft", config=_resolved(cfg))


def _resolved(cfg: Config) -> dict:
    """The config as the run's config.toml holds it."""
    return cfg.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class Placement:
    """Where the model trains: this rank, the parallel mode and the number formats."""

    dist: parallel.Dist
    mode: str
    numerics: Numerics


def build_optimizer(
    section: OptimizerSection, model: torch.nn.Module, device, *, announce: bool = False
):
    """AdamW on every trainable parameter, or (`name = "muon"`) Muon on the decoder blocks'
    matrices and AdamW on the rest (hanlm.train.muon), said at start when `announce`."""
    betas = (section.beta1, section.beta2)
    wd = section.weight_decay
    if section.name == "adamw":
        return adamw(
            model, lr=section.lr, weight_decay=wd, betas=betas, eps=section.eps, device=device
        )
    # Muon with LoRA is refused with the recipe (config.loading): a LoRA model here is a bug
    assert not hasattr(parallel.unwrap(model), "peft_config"), "Muon with LoRA reached training"
    return muon_adamw(section, model, device, announce=announce)


def muon_adamw(section: OptimizerSection, model: torch.nn.Module, device, *, announce: bool):
    plain = parallel.unwrap(model)
    parts = muon.split(plain, parallel.decoder_layers(plain))
    muon_lr = section.muon_lr or section.lr
    muon_wd = (
        section.weight_decay if section.muon_weight_decay is None else section.muon_weight_decay
    )
    if announce:
        info(parts.describe(muon_lr, section.lr))
    rest = adamw_over(
        [p for _, p in parts.adamw], lr=section.lr, weight_decay=section.weight_decay,
        betas=(section.beta1, section.beta2), eps=section.eps,
    )  # fmt: skip
    matrices = muon.Muon(
        [{"params": [p for _, p in parts.muon], "lr_scale": muon_lr / section.lr}],
        ns_dtype=torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16,
        lr=muon_lr, weight_decay=muon_wd, momentum=section.muon_momentum, nesterov=True,
        ns_steps=section.muon_ns_steps, adjust_lr_fn=section.muon_adjust_lr,
    )  # fmt: skip
    return muon.MuonAdamW(rest, matrices)


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
    section: CheckpointSection, root: Path, place: str, dist: parallel.Dist
) -> CheckpointManager:
    """The manager of the checkpoints in `root`; a mirror keeps them in its folder `place`, so
    each training of each run restores and prunes only its own."""
    policy = Policy(**section.model_dump(include=CheckpointSection.POLICY_KEYS))
    if policy.mirror:
        policy = dataclasses.replace(policy, mirror=checkpoint_mirror.place(policy.mirror, place))
    return CheckpointManager(root, dist, policy)


@contextlib.contextmanager
def processes(device: str, timeout_s: float = 600.0) -> Iterator[parallel.Dist]:
    """This process's place among the ranks (a process group under torchrun), left at the end.
    A failure caused by a peer that is gone is reported as PeerLost, naming it."""
    dist = parallel.init(device, timeout_s=timeout_s)
    try:
        yield dist
    except BaseException as e:
        # a preemption stops every rank on its own (they agreed, then saved): peers that are
        # already gone left for the same reason
        failed = isinstance(e, Exception) and not isinstance(e, Preempted)
        # torchrun's agent stops its workers with SIGTERM when it loses its rendezvous store
        # (the lost host held it): that must not cut short naming the lost peer
        deferred = PreemptionWatch().install() if failed else None
        lost = parallel.lost_peers(dist, e) if failed else None
        # leaving a group whose peers (or whose store's host) are gone can fail too; that
        # second failure would hide the first behind a traceback
        with contextlib.suppress(Exception):
            parallel.shutdown(dist)
        if lost is not None:
            raise lost from e  # still deferred: the CLI ignores stop signals once it reports it
        if deferred is not None:
            deferred.uninstall()
        raise
    parallel.shutdown(dist)


def start_fresh(dist: parallel.Dist, paths: list[Path]) -> None:
    """Remove an earlier training's checkpoints and records (on rank 0) before training anew."""
    if dist.is_main:
        for path in paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    parallel.barrier(dist)


@dataclass(frozen=True)
class TrainingJob:
    """What a training brings that the config sections do not say."""

    total_steps: int
    accumulation: int
    train_loader: object
    val_loader: object | None
    checkpoints_dir: Path
    checkpoints_place: str  # the folder under [checkpoint] mirror that is this training's
    metrics_path: Path
    flops_per_token: float
    fingerprint: str  # model and data: a checkpoint must match it to be resumed
    settings: str  # every setting of the stage: a finished run with other ones is not reused
    student_tokenizer: Path  # distillation checks the teacher's vocabulary against it
    token_bytes: torch.Tensor | None = None
    after_optimizer_step: Callable[[], None] | None = None
    configure_optimizer: Callable[[torch.optim.Optimizer], None] | None = None


def mfu_peak(at: Placement) -> tuple[float, str]:
    """The peak FLOP/s that MFU divides by, pretraining and SFT alike: the device's at the
    number format the training resolved to, and where the figure comes from."""
    return device_peak_flops(at.dist.device, at.numerics.name)


def trainer_settings(job: TrainingJob, components: Components, at: Placement) -> TrainerSettings:
    return TrainerSettings(
        accumulation=job.accumulation,
        grad_clip=components.optimizer.grad_clip,
        max_nonfinite_steps=components.optimizer.max_nonfinite_steps,
        optimizer_keys="sft.optimizer" if components.stage == "sft" else "optimizer",
        checkpoint_every=components.checkpoint.every,
        flops_per_token=job.flops_per_token,
        peak_flops=mfu_peak(at)[0],
        fingerprint=job.fingerprint,
        settings=job.settings,
        **components.logging.model_dump(include=LoggingSection.CADENCE_KEYS),
    )


def _planted_failure(stage: str, rank: int) -> None:
    """Test hook: HANLM_FAULT_TRAINING=STAGE:RANK fails that training (pretrain or sft) on that
    rank once its processes have joined and built their groups, as a rank whose device fails
    mid-run does (the others learn it at their next collective)."""
    if os.environ.get("HANLM_FAULT_TRAINING") == f"{stage}:{rank}":
        raise RuntimeError(f"planted failure of {stage} on rank {rank} (HANLM_FAULT_TRAINING)")


def build_trainer(
    model: torch.nn.Module, job: TrainingJob, at: Placement, components: Components
) -> Trainer:
    """The Trainer of a model already placed and parallelised, from its components' sections."""
    adam = build_optimizer(components.optimizer, model, at.dist.device, announce=at.dist.is_main)
    if job.configure_optimizer is not None:
        job.configure_optimizer(adam)
    vocab_size = parallel.unwrap(model).config.get_text_config().vocab_size
    objective_for = distill.make_objective(  # distillation applies to SFT as to pretraining
        components.distill, vocab_size, at.dist.device, student_tokenizer=job.student_tokenizer
    )
    par = components.parallel
    loss = TokenLoss.from_settings(par.loss_chunk_tokens, par.loss_kernel, at.dist.device)
    checkpoints = build_checkpoints(
        components.checkpoint, job.checkpoints_dir, job.checkpoints_place, at.dist
    )
    _planted_failure(components.stage, at.dist.rank)
    return Trainer(
        model=model,
        optimizer=adam,
        train_loader=job.train_loader,
        val_loader=job.val_loader,
        schedule=build_schedule(components.optimizer, job.total_steps),
        settings=trainer_settings(job, components, at),
        dist=at.dist,
        mode=at.mode,
        numerics=at.numerics,
        metrics_path=job.metrics_path,
        token_bytes=job.token_bytes,
        after_optimizer_step=job.after_optimizer_step,
        checkpoints=checkpoints,
        every_minutes=components.checkpoint.every_minutes,
        loss=loss,
        objective_for=objective_for,
        trackers=trackers.setup_for(
            components.logging, components.stage, job.metrics_path.parent, components.config
        ),
    )
