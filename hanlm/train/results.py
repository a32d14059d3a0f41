"""What training hands over, with a declared shape (hanlm.results): the pretraining and SFT
summaries and the export record. Kept apart from the training code so that what reads them (the
report card, the model card, publishing) does not import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hanlm.results import Part, Result, read_records


class PretrainSummary(Result):
    """`pretrain/summary.json` (rank 0 writes it once the last step is checkpointed); every
    rank's `pretrain` returns it, finished or not."""

    FILE = "summary.json"
    MADE_BY = "pretrain"

    step: int
    tokens: int
    completed: bool
    val_loss: float | None = None  # the last validation, when one ran
    val_bpb: float | None = None
    val_loss_by_source: dict[str, float] | None = None  # corpus sources' validation, when 2+
    mixture: list[dict[str, Any]] | None = None  # the mix trained on (hanlm.data.mixture rows)
    total_steps: int
    world_size: int
    mode: str  # single, ddp, fsdp
    cpu_threads: int | None = None  # on a CPU: the weights' last bits depend on it


class Closure(Part):
    """Held-out answers the chat model ended with <|eot|>, of those it was asked for."""

    closed: int
    total: int
    rate: float


class SftSummary(Result):
    """`sft/summary.json`, which rank 0 writes with the closure check; the other ranks' `fine_tune`
    returns only the training's part (the closure and the data are None there)."""

    FILE = "summary.json"
    MADE_BY = "sft"

    init: str
    method: str  # full or lora
    step: int
    tokens: int
    val_loss: float | None = None
    closure: Closure | None = None
    closure_by_variant: dict[str, float] | None = None  # variant name -> closure rate
    untrained_template_tokens: list[str] | None = None
    hf: str | None = None  # the exported chat model's folder
    data: SftData | None = None  # conversations, rows, tokens, by source
    contaminated_dropped: int | None = None


class ExportRecord(Result):
    """`hf/hanlm_export.json`: which checkpoint an export holds, its weights' sha256, its dtype
    and special-token ids, and the fingerprint a rerun recognises it by."""

    FILE = "hanlm_export.json"
    MADE_BY = "export"

    source_checkpoint: str
    step: int | None
    tokens: int | None
    model_sha256: str
    dtype: str
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    fingerprint: str
    exported_at: float
    # the entries hanlm wrote into the folder (files.OUTPUT_FILES_KEY): added when the record
    # is the marker of a folder of the user's choosing (`hanlm export --out`), not a stage's
    output_files: list[str] | None = None


# --- SFT's checks: the closure check and the special-token audit --------------------------------


class ClosureAnswer(Part):
    """One held-out prompt's greedy answer in the closure check."""

    id: str | None
    prompt: str
    answer: str
    reference: str
    closed: bool
    loops: bool  # unclosed, and at least half its 4-grams repeated
    new_tokens: int


class MatrixNorms(Part):
    """One token matrix's row norms: the ordinary rows' mean and median, each template token's."""

    ordinary_mean: float
    ordinary_median: float
    template: dict[str, float]  # system, user, assistant, eot -> that token's row norm


class RowNorms(Part):
    """The token matrices' row norms (the head only when it is untied) and the norm a row starts
    with (initializer_range x sqrt(width), when the config says)."""

    embedding: MatrixNorms
    head: MatrixNorms | None = None
    initial_norm: float | None = None


class EndRank(Part):
    """Where the held-out reference answers end: how many tokens' logits beat the end token's."""

    answers: int
    median_rank: int
    mean_rank: float
    top1: float  # the share of answer ends where the end token is the first choice
    mean_logprob: float


class ModelDiagnosis(Part):
    """Why answers end or not, for one model: its template rows and the end token's rank."""

    row_norms: RowNorms
    eot_rank: EndRank


class Diagnosis(Part):
    before: ModelDiagnosis  # the source model with the initialisation applied
    after: ModelDiagnosis  # the SFT model


class ClosureCheck(Result):
    """`sft/closure.json` (and each compared variant's `sft/ablation/VARIANT/closure.json`): how
    many held-out answers the chat model ended with the template's end token."""

    FILE = "closure.json"
    MADE_BY = "sft"

    closed: int
    total: int
    rate: float
    end_token: str
    interval: tuple[float, float]  # Wilson's 95% interval of the rate
    unclosed_looping: int
    init: str | None
    max_new_tokens: int
    examples: list[ClosureAnswer]
    unclosed_examples: list[ClosureAnswer]
    variant: str
    method: str  # full or lora
    rows_trained: bool | None = None  # LoRA: whether the template rows trained
    diagnosis: Diagnosis

    @property
    def frozen(self) -> bool:
        """LoRA with the template rows frozen: they end SFT where pretraining and init left them."""
        return self.method == "lora" and not self.rows_trained


class AuditedToken(Part):
    """One special token in the audit: its pretraining count, its rows' indicators per token
    matrix, and the verdict with what it rests on."""

    name: str
    token: str
    id: int
    template: bool
    pretrain_count: int | None
    embedding_norm: float | None = None
    embedding_norm_ratio: float | None = None
    embedding_cos_mean: float | None = None
    embedding_cos_reference: float | None = None
    head_norm: float | None = None
    head_norm_ratio: float | None = None
    head_cos_mean: float | None = None
    head_cos_reference: float | None = None
    geometry_under_trained: bool | None
    verdict: str  # trained, untrained, unknown
    basis: str  # pretraining count, row geometry, added to the vocabulary by hanlm, ...


class AuditDecision(Part):
    """Where an indicator separates trained rows from the reference (never-trained) ones."""

    indicator: str
    ordinary_median: float | None = None
    reference_median: float | None = None
    threshold: float | None = None
    usable: bool | None = None


class TokenAudit(Result):
    """`sft/audit.json`: the special-token audit of the model SFT starts from."""

    FILE = "audit.json"
    MADE_BY = "sft"

    tied: bool
    counts_source: str | None
    tokens: list[AuditedToken]
    decisions: dict[str, AuditDecision]  # token matrix -> its decision point
    untrained_template_tokens: list[str]
    row_norms: RowNorms
    source: str


class ChatSourceReport(Part):
    """One chat data source as SFT read it."""

    inputs: list[str]
    format: str
    format_detected: bool
    rows: int
    conversations: int
    skipped: dict[str, int]  # reason -> rows that could not be read
    skipped_examples: dict[str, list[Any]]
    taken: int
    epochs: float


class SftData(Part):
    """The chat data SFT trained on and held out, by source (the summary carries it too)."""

    conversations: int
    train_conversations: int
    heldout_conversations: int
    too_long_dropped: int
    train_rows: int
    trained_tokens: int
    packing: bool
    closure_prompts: int
    sources: dict[str, ChatSourceReport]
    fingerprint: str


class SftDataReport(Result, SftData):
    """`sft/data.json`: the chat data, and the conversations dropped for holding benchmark
    items."""

    FILE = "data.json"
    MADE_BY = "sft"

    contamination: dict[str, Any]  # checked, dropped, the dropped conversations and their items


class MetricsRecord(Part):
    """One line of a training's metrics.jsonl (pretrain/ or sft/), as rank 0 logs it."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens: int
    tokens_per_s: float
    mfu: float | None
    peak_memory_gb: float
    ce: float | None = None  # distillation: the cross-entropy part of the loss
    kl: float | None = None  # distillation: the KL part
    val_loss: float | None = None
    val_bpb: float | None = None
    val_loss_by_source: dict[str, float] | None = None


def read_metrics(path: Path) -> list[MetricsRecord]:
    """The records of a metrics.jsonl, in order ([] when the training did not run); see
    hanlm.results.read_records."""
    fix = "the training that wrote it rewrites it: run it again with --force"
    return read_records(path, MetricsRecord, what="a metrics record", fix=fix)
