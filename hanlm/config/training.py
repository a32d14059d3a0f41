"""The training components, shared by pretraining and SFT: [model], [optimizer], [precision],
[parallel], [checkpoint], [logging] and [distill]; and [pretrain], what only pretraining has.
SFT's own copies ([sft.optimizer], [sft.checkpoint], [sft.logging]) are in hanlm.config.sft."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hanlm.config.base import Device, Section


class ModelSection(Section):
    """The model pretraining builds (SFT starts from pretraining's, or from sft.model)."""

    preset: str = Field(
        "demo",
        description="model preset (tiny, demo, 125m, 350m, 1.3b) or a transformers config.json",
        json_schema_extra={"cli": {"aliases": ["model-config"]}},
    )
    init_from: str | None = Field(
        None,
        description="continued pretraining: a Hugging Face causal LM (folder or Hub id) whose "
        "weights, architecture and tokenizer pretraining starts from, instead of model.preset",
    )
    trust_remote_code: bool = Field(
        False,
        description="run the Python code a model folder names in its auto_map (an architecture "
        "transformers does not ship), for init_from, sft.model and every model the run loads; "
        "read that code first",
    )

    @model_validator(mode="after")
    def _preset_or_init_from(self) -> ModelSection:
        if self.init_from and "preset" in self.model_fields_set:
            raise ValueError(
                "model.preset and model.init_from are both set: init_from brings its own "
                "architecture; drop model.preset (or init_from, to train from scratch)"
            )
        return self


class OptimizerSection(Section):
    """AdamW and its learning-rate schedule, for pretraining only.

    SFT does not read this section: [sft.optimizer] is a separate copy of these fields with
    SFT's own defaults, so a value set here (e.g. optimizer.beta2) does not reach SFT; set it
    again as sft.optimizer.KEY to change SFT's."""

    lr: float = Field(3e-4, gt=0, description="peak learning rate")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a share of the peak")
    warmup_steps: int = Field(100, ge=0)
    schedule: Literal["cosine", "wsd"] = Field(
        "cosine", description="cosine, or warm-up-stable-decay"
    )
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps spent decaying")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay (never on norms and biases)")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="max gradient norm; 0 = no clipping")
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description="steps in a row with a non-finite (NaN/inf) loss or gradient norm before "
        "training stops with the diagnosis; each such step's update is skipped",
    )
    name: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw: AdamW on every parameter; muon: Muon on the decoder blocks' "
        "matrices and AdamW (lr, weight_decay, betas) on the embedding, head, norms and biases",
    )
    muon_lr: float | None = Field(
        None, gt=0, description="Muon's peak learning rate (unset: lr), on the same schedule"
    )
    muon_weight_decay: float | None = Field(
        None, ge=0, description="Muon's decoupled weight decay (unset: weight_decay)"
    )
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="Muon's Nesterov momentum")
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw",
        description="Muon's step per matrix: lr x 0.2 sqrt(max(rows, cols)) (Moonlight's: "
        "AdamW's lr and weight decay carry over), or lr x sqrt(max(1, rows/cols)) (Jordan's)",
    )
    muon_ns_steps: int = Field(5, ge=1, le=20, description="Muon's Newton-Schulz iterations")


class PrecisionSection(Section):
    """Number formats of training, pretraining and SFT alike (hanlm.train.precision)."""

    mode: Literal["fp32", "bf16", "fp8", "fp8-emulate", "fp4"] = Field(
        "bf16",
        description="number format of training (fp4 is refused)",
        json_schema_extra={"cli": {"flag": "precision"}},
    )
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"


class ParallelSection(Section):
    """How training uses the processes and devices at hand."""

    mode: Literal["auto", "single", "ddp", "fsdp"] = Field(
        "auto",
        description="auto: single process alone, FSDP2 under torchrun",
        json_schema_extra={"cli": {"flag": "parallel"}},
    )
    device: Device = Field("auto", description="auto, cpu or cuda (each rank takes its GPU)")
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none",
        description="pretraining recomputes activations in backward: full keeps each layer's "
        "input only, selective also its matmul and attention outputs (true = full, false = none)",
        json_schema_extra={"cli": {"const": "full"}},  # the flag alone: full
    )
    compile: bool | None = Field(
        None,
        description="torch.compile each decoder block; unset: on with precision fp8 (FP8 is "
        "fast only compiled), off otherwise",
    )
    fsdp_float8_all_gather: bool = Field(False, description="FSDP all-gathers weights in FP8")
    timeout_s: float = Field(
        600,
        gt=0,
        description="a collective waiting this long for a peer (a hung or unreachable host) "
        "fails; a peer whose process is gone is noticed at once",
        json_schema_extra={"cli": {"flag": "collective-timeout", "metavar": "S"}},
    )
    document_attention: Literal["auto", "sdpa", "flex"] = Field(
        "auto",
        description="how packed documents (sft.packing, pretrain.document_masking) are kept "
        "apart: flex attention's block mask, or SDPA with a block-diagonal mask; auto: flex on "
        "CUDA, sdpa elsewhere",
    )
    loss_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="training and validation: the loss makes the logits of this many tokens at "
        "a time, never those of a whole batch",
    )
    loss_kernel: Literal["chunked", "auto", "liger"] = Field(
        "chunked",
        description="how the loss runs: chunked (any device), liger (the fused linear cross "
        "entropy of Liger Kernel: CUDA, when installed), auto (liger where it can, else chunked)",
    )

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_from_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "full" if value else "none"
        return value

    @field_validator("device")
    @classmethod
    def _one_gpu_per_rank(cls, value: str) -> str:
        if value.startswith("cuda:"):
            raise ValueError(
                f"{value!r}: training gives each rank the GPU of its LOCAL_RANK; use cuda "
                "(and CUDA_VISIBLE_DEVICES to choose GPUs)"
            )
        return value


class CheckpointCadence(Section):
    """When a training stage saves: every N steps, every M minutes, and whether it resumes."""

    every: int = Field(
        500,
        ge=0,
        description="steps between checkpoints; 0 = at the end",
        json_schema_extra={"cli": {"flag": "checkpoint-every"}},
    )
    every_minutes: float = Field(
        0,
        ge=0,
        description="also save after this many minutes; 0 = off",
        json_schema_extra={"cli": {"flag": "checkpoint-every-minutes"}},
    )
    resume: Literal["auto", "never"] = Field(
        "auto", description="continue from the latest checkpoint"
    )


class CheckpointSection(CheckpointCadence):
    """Checkpoints of pretraining and SFT: cadence, retention and how they are written
    (SFT's cadence is [sft.checkpoint]; the rest is shared)."""

    async_save: bool = Field(
        True, description="write in the background; the loop blocks only to stage"
    )
    keep_last: int = Field(3, ge=1, description="committed checkpoints kept (newest first)")
    keep_every: int = Field(
        0, ge=0, description="also keep every checkpoint at a multiple of N steps"
    )
    retries: int = Field(3, ge=0, description="retries of a failed write, with exponential backoff")
    backoff_s: float = Field(2.0, ge=0)
    max_consecutive_failures: int = Field(3, ge=1, description="then stop cleanly")
    timeout_s: float = Field(1800, gt=0, description="a write slower than this counts as failed")
    mirror: str | None = Field(None, description="second location: a folder or an fsspec URL")

    # how a checkpoint is written and kept: what the CheckpointManager's Policy takes
    POLICY_KEYS: ClassVar[frozenset[str]] = frozenset(
        {"async_save", "keep_last", "keep_every", "retries", "backoff_s"}
        | {"max_consecutive_failures", "timeout_s", "mirror"}
    )


class LoggingCadence(Section):
    """How often a training logs and validates."""

    log_every: int = Field(10, ge=1)
    eval_every: int = Field(100, ge=0, description="validation every N steps; 0 = only at the end")
    eval_batches: int = Field(20, ge=1, description="validation micro-batches per rank")


class WandbSection(Section):
    """Weights & Biases, when [logging] trackers holds "wandb"."""

    project: str = Field(
        "hanlm",
        min_length=1,
        description="W&B project of the runs",
        json_schema_extra={"cli": {"flag": "wandb-project"}},
    )
    entity: str | None = Field(
        None,
        description="W&B team or user the project belongs to; unset: your default entity",
        json_schema_extra={"cli": {"flag": "wandb-entity"}},
    )
    mode: Literal["online", "offline"] = Field(
        "online",
        description="online needs `wandb login` (or WANDB_API_KEY); offline writes the run "
        "under dir only, to upload later with `wandb sync`",
        json_schema_extra={"cli": {"flag": "wandb-mode"}},
    )
    dir: str | None = Field(
        None,
        description="where W&B keeps its files; unset: the stage's folder (RUN/pretrain, RUN/sft)",
        json_schema_extra={"cli": {"flag": False}},
    )


class TrackioSection(Section):
    """trackio (local-first; a Hugging Face Space when asked), when [logging] trackers holds
    "trackio". Locally it writes to TRACKIO_DIR (default ~/.cache/huggingface/trackio)."""

    project: str = Field(
        "hanlm",
        min_length=1,
        description="trackio project of the runs",
        json_schema_extra={"cli": {"flag": "trackio-project"}},
    )
    space_id: str | None = Field(
        None,
        description='log to this Hugging Face Space ("user/name"; needs `hf auth login` or '
        "HF_TOKEN); unset: the local database",
        json_schema_extra={"cli": {"flag": "trackio-space-id"}},
    )


class LoggingSection(LoggingCadence):
    """How often training logs and validates, and the trackers that receive what goes to
    metrics.jsonl (pretraining and SFT alike; SFT's cadence is [sft.logging])."""

    trackers: list[Literal["tensorboard", "trackio", "wandb"]] | None = Field(
        None,
        description="experiment trackers, one or several of tensorboard, trackio, wandb, each "
        "checked before training starts; [] for metrics.jsonl only; unset: TensorBoard when "
        "it is installed",
        json_schema_extra={"cli": {"flag": "tracker"}},
    )
    name: str | None = Field(
        None,
        description="the run's name in the trackers; unset: the run directory's name. "
        "Pretraining logs as NAME-pretrain and SFT as NAME-sft, grouped under NAME",
        json_schema_extra={"cli": {"flag": "tracker-run-name"}},
    )
    wandb: WandbSection = Field(default_factory=WandbSection)
    trackio: TrackioSection = Field(default_factory=TrackioSection)

    # the keys that say when the loop logs, as opposed to where the records go
    CADENCE_KEYS: ClassVar[frozenset[str]] = frozenset(LoggingCadence.model_fields)

    @field_validator("trackers")
    @classmethod
    def _each_once(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"a tracker is named twice in {value}; name each once")
        return value


class PretrainSection(Section):
    """`hanlm pretrain`: what only pretraining has: its sequences, batch and length."""

    seq_len: int = Field(512, ge=8, description="tokens per training sequence")
    micro_batch: int = Field(8, ge=1, description="sequences per rank per forward/backward")
    global_batch_tokens: int = Field(
        65536, ge=8, description="tokens per optimizer step over all ranks (sets accumulation)"
    )
    max_steps: int | None = Field(None, ge=1, description="optimizer steps (or use max_tokens)")
    max_tokens: int | None = Field(None, ge=1, description="training tokens, rounded to steps")
    document_masking: bool = Field(
        False,
        description="a window's documents (split at the end-of-document token) do not see "
        "each other: attention stays within a document, positions restart at each",
    )

    def steps(self) -> int | None:
        """Optimizer steps: max_steps, or max_tokens in whole steps; None when neither is set."""
        if self.max_steps is not None:
            return self.max_steps
        if self.max_tokens is not None:
            return max(1, -(-self.max_tokens // self.global_batch_tokens))
        return None

    @model_validator(mode="after")
    def _whole_micro_batches(self) -> PretrainSection:
        per_pass = self.seq_len * self.micro_batch
        if self.global_batch_tokens % per_pass:
            fitting = max(per_pass, round(self.global_batch_tokens / per_pass) * per_pass)
            raise ValueError(
                f"pretrain.global_batch_tokens {self.global_batch_tokens:,} is not a multiple of "
                f"seq_len x micro_batch = {self.seq_len} x {self.micro_batch} = {per_pass:,} "
                f"(e.g. {fitting})"
            )
        return self


class DistillSection(Section):
    """Distillation toward a teacher during pretraining or SFT (off by default: measure it first)."""

    enabled: bool = False
    teacher: str | None = Field(
        None, description="Hugging Face model folder with the same tokenizer as the student"
    )
    alpha: float = Field(0.5, ge=0, le=1, description="share of the KL term: (1-a)*CE + a*T^2*KL")
    temperature: float = Field(2.0, gt=0, le=100, description="softmax temperature of both sides")
    teacher_device: Literal["same"] | Device = Field(
        "same", description="`same` (the student's device), cpu, cuda or cuda:N"
    )
