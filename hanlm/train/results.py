"""What training hands over, with a declared shape (hanlm.results): the pretraining and SFT
summaries and the export record. Kept apart from the training code so that what reads them (the
report card, the model card, publishing) does not import torch."""

from __future__ import annotations

from typing import Any

from hanlm.results import Part, Result


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
    data: dict[str, Any] | None = None  # conversations, rows, tokens, the file and its sha256
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
