"""[sft]: chat fine-tuning, its sources, LoRA, the compared variants, and its own optimizer,
checkpoint cadence and logging (copies of the training sections with SFT's defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hanlm.config.base import (
    _NO_FLAG,
    EPOCHS_WARNING,
    WEIGHT_TOLERANCE,
    Section,
    SourceName,
    _names_once,
)
from hanlm.config.training import CheckpointCadence, LoggingCadence, OptimizerSection


class SftOptimizerSection(OptimizerSection):
    """SFT's optimizer: a higher peak, a short warm-up and no weight decay by default.

    The same fields as [optimizer], with their own defaults: nothing is inherited from
    [optimizer] (a recipe's optimizer.beta2, say, leaves SFT at the default here); every value
    SFT should use is set under [sft.optimizer]."""

    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0, description="AdamW decay (never on norms and biases)")


class SftCheckpointSection(CheckpointCadence):
    """SFT's checkpoint cadence; how checkpoints are written and kept is [checkpoint]'s."""

    every: int = Field(
        100,
        ge=0,
        description="steps between checkpoints; 0 = at the end",
        json_schema_extra={"cli": {"flag": "checkpoint-every"}},
    )


class SftLoggingSection(LoggingCadence):
    """SFT's cadence; the trackers are [logging]'s."""

    eval_every: int = Field(0, ge=0, description="held-out loss every N steps; 0 = at the end")
    eval_batches: int = Field(8, ge=1, description="held-out micro-batches per rank")


LORA_TARGETS_DEFAULT = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class SftLoraSection(Section):
    """LoRA's settings (sft.method = "lora"), PEFT's LoraConfig by other names: adapters of
    rank `rank` scaled by alpha / rank on the named linear layers of every block."""

    rank: int = Field(
        16,
        ge=1,
        description="the adapters' rank r",
        json_schema_extra={"cli": {"flag": "lora-rank"}},
    )
    alpha: float = Field(
        32.0,
        gt=0,
        description="scale alpha: updates are scaled by alpha / rank",
        json_schema_extra={"cli": {"flag": "lora-alpha"}},
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout on the adapters' input",
        json_schema_extra={"cli": {"flag": "lora-dropout"}},
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS_DEFAULT),
        min_length=1,
        description="the linear layers that get adapters, by name (Llama's attention and MLP)",
        json_schema_extra={"cli": {"flag": "lora-target-modules", "metavar": "NAME,..."}},
    )


Init = Literal["mean", "mean-cov", "text", "none"]


class SftVariant(Section):
    """One variant of an SFT in sft.compare: the settings it changes (unset: the SFT's own)."""

    init: Init | None = None
    method: Literal["full", "lora"] | None = None
    train_new_token_rows: bool | None = None

    def resolved(self, sft: SftSection) -> SftVariant:
        return SftVariant(
            init=self.init or sft.init,
            method=self.method or sft.method,
            train_new_token_rows=(
                sft.train_new_token_rows
                if self.train_new_token_rows is None
                else self.train_new_token_rows
            ),
        )

    @property
    def name(self) -> str:
        """full-mean, lora-none-frozen, lora-mean-rows: the folder and the key of its closure
        (full fine-tuning trains every row: its name says nothing about them)."""
        if self.method == "full":
            return f"full-{self.init}"
        return f"lora-{self.init}-{'rows' if self.train_new_token_rows else 'frozen'}"

    @property
    def rows_stay_untrained(self) -> bool:
        """LoRA with the template rows frozen and not initialised: the field's setup, whose
        answers never end."""
        return self.method == "lora" and not self.train_new_token_rows and self.init == "none"


CHAT_FORMATS = ("messages", "sharegpt", "alpaca")


class SftSourceSection(Section):
    """One `[[sft.sources]]` table: a named set of chat data, its shape and its share."""

    name: SourceName = Field(description="the source's name in the SFT data report")
    inputs: list[str] = Field(
        min_length=1,
        description="globs of .jsonl/.json/.parquet files (optionally .gz/.zst) or "
        "hf:NAME[@REVISION][:CONFIG]:SPLIT ids, as corpus inputs",
    )
    weight: float | None = Field(
        None,
        gt=0,
        le=1,
        description="share of the training conversations (the weights sum to 1); unset on "
        "every source: each conversation once",
    )
    max_epochs: float = Field(
        EPOCHS_WARNING,
        gt=0,
        le=1000,
        description="how often its conversations may repeat to reach its share; more is an "
        "error before training",
    )
    format: Literal["auto", "messages", "sharegpt", "alpaca"] = Field(
        "auto",
        description='"messages" ({"messages": [{"role", "content"}]}), "sharegpt" '
        '({"conversations": [{"from", "value"}]}), "alpaca" (instruction, input, output), or '
        '"auto": told from the first row, and said',
    )
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="the format's keys named as this source names them, e.g. "
        '{ conversations = "dialog", from = "speaker" } (messages: messages, role, content; '
        "sharegpt: conversations, from, value, system; alpaca: instruction, input, output, "
        "system; any: id)",
    )


class SftSection(Section):
    """`hanlm sft`: chat fine-tuning with the special-token audit, initialisation and closure check.

    It shares [precision] and [parallel] with pretraining and [checkpoint]'s policy; its
    optimizer, checkpoint cadence and logging are its own, in [sft.optimizer],
    [sft.checkpoint] and [sft.logging] ([optimizer]'s values are not inherited).
    """

    model: str | None = Field(
        None,
        description="HF folder to fine-tune instead of the run's pretraining checkpoint",
        json_schema_extra={"cli": {"metavar": "HF_DIR"}},
    )
    data: str | None = Field(
        None,
        description="one chat data source (a file, glob or hf: id, its format told from its "
        "first row): the shorthand for one [[sft.sources]]; default: the run's demo world "
        "DIR/demo/chat.jsonl",
    )
    sources: list[SftSourceSection] = Field(
        default_factory=list,
        description="[[sft.sources]] tables: chat data in several sets, shapes and shares",
        json_schema_extra=_NO_FLAG,
    )
    strict: bool = Field(
        False,
        description="the first chat row that cannot be read is an error (else rows are "
        "skipped, counted by reason with examples in the SFT data report)",
    )
    seq_len: int = Field(256, ge=16, description="tokens per training row; longer chats dropped")
    micro_batch: int = Field(8, ge=1, description="rows per rank per forward/backward")
    batch_rows: int = Field(8, ge=1, description="rows per optimizer step over all ranks")
    packing: bool = Field(True, description="pack whole conversations into rows (else pad)")
    max_steps: int = Field(200, ge=1, description="optimizer steps")
    heldout: int = Field(50, ge=1, description="conversations held out for the closure check")
    init: Init = Field(
        "mean", description="initialisation of the template tokens the audit finds untrained"
    )
    init_text: str = Field(".", min_length=1, description="init = text: mean of its tokens' rows")
    new_token_lr_scale: float = Field(
        1.0,
        gt=0,
        description="full fine-tuning: the initialised rows' update size relative to the "
        "schedule (LoRA's trained rows follow the schedule)",
    )
    closure_max_tokens: int = Field(64, ge=1, description="greedy tokens per closure prompt")
    min_closure: float = Field(0.0, ge=0, le=1, description="fail below this rate; 0 = off")
    method: Literal["full", "lora"] = Field(
        "full",
        description="full: every weight trains; lora: PEFT's LoRA adapters on sft.lora."
        "target_modules, the rest frozen, merged into the export",
    )
    lora: SftLoraSection = Field(default_factory=SftLoraSection)
    train_new_token_rows: bool = Field(
        True,
        description="lora: also train the chat template tokens' embedding rows (only those "
        "rows: PEFT's trainable_token_indices); false freezes them, the field's failing setup",
    )
    compare: list[SftVariant] = Field(
        default_factory=list,
        description="also train these variants of this SFT (ablation/<name>/), e.g. "
        '[{init = "none", method = "lora", train_new_token_rows = false}]',
        json_schema_extra={"cli": {"flag": False}},  # --set sft.compare=[{...}, ...]
    )
    contaminated: Literal["drop", "fail"] = Field(
        "drop", description="conversations holding benchmark items: drop them or fail"
    )
    contamination_coverage: float = Field(
        0.5, gt=0, le=1, description="share of an item a conversation must hold to count"
    )
    optimizer: SftOptimizerSection = Field(default_factory=SftOptimizerSection)
    checkpoint: SftCheckpointSection = Field(default_factory=SftCheckpointSection)
    logging: SftLoggingSection = Field(default_factory=SftLoggingSection)

    @model_validator(mode="after")
    def _one_data_layout(self) -> SftSection:
        if self.sources and self.data:
            raise ValueError(
                "sft.data and [[sft.sources]] are both set: sft.data is the one-source "
                "shorthand; list it among the sources, or drop the sources"
            )
        _names_once("[[sft.sources]]", self.sources)
        weighted = [s.weight is not None for s in self.sources]
        if any(weighted) and not all(weighted):
            bare = ", ".join(s.name for s in self.sources if s.weight is None)
            raise ValueError(
                f"sft source(s) {bare} have no weight while others do: give every source a "
                "weight, or none (each conversation once)"
            )
        weights = [s.weight for s in self.sources if s.weight is not None]
        if weights and abs(sum(weights) - 1.0) > WEIGHT_TOLERANCE:
            raise ValueError(f"the sft source weights sum to {sum(weights):.4g}, not 1")
        return self

    def source_list(self) -> list[SftSourceSection]:
        """The sources; `data` as one source named "chat"; [] for the demo world's chats."""
        if self.sources:
            return list(self.sources)
        return [SftSourceSection(name="chat", inputs=[self.data])] if self.data else []

    @model_validator(mode="after")
    def _whole_micro_batches(self) -> SftSection:
        if self.batch_rows % self.micro_batch:
            raise ValueError(
                f"sft.batch_rows {self.batch_rows} is not a multiple of sft.micro_batch "
                f"{self.micro_batch}"
            )
        return self

    def variant(self) -> SftVariant:
        """This SFT's own variant (its name keys its closure beside the compared ones)."""
        return SftVariant(
            init=self.init, method=self.method, train_new_token_rows=self.train_new_token_rows
        ).resolved(self)

    def variants(self) -> list[SftVariant]:
        """This SFT's variant, then each compared one not equal to an earlier one."""
        seen: dict[str, SftVariant] = {}
        for variant in [self.variant(), *(v.resolved(self) for v in self.compare)]:
            seen.setdefault(variant.name, variant)
        return list(seen.values())
