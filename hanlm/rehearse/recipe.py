"""The rehearsal's recipe: the run's own, with its shapes kept and its budgets made small.

Kept as the run has them: the model (preset or `model.init_from`), the vocabulary size, the
sequence length and micro-batch, precision (FP8 included), parallelism, compile, activation
checkpointing, the optimizer, the checkpoint storage and its mirror (under the rehearsal's own
place), the SFT method and shapes, the eval tasks and decoding settings, every data source and
benchmark. Made small: how much of each source is read, the tokenizer's sample, the steps of
pretraining and SFT (pretraining past its warm-up, then timed), the eval items.
"""

from __future__ import annotations

from typing import Any

from hanlm.config import DEFAULT_SOURCE, Config

WARMUP_STEPS = 5  # compile, the allocator and the data loader settle: not timed
PRETRAIN_STEPS = 30  # the 25 after the warm-up are timed (at least 20)
CHECKPOINT_EVERY = 10  # saves at 10, 20 and 30: the resume check stops one in flight
SFT_STEPS = 4
SFT_HELDOUT = 4  # held-out conversations the closure check generates for: the path, not a rate
EVAL_ITEMS = 4  # items of every task
MAX_NEW_TOKENS = 32  # generation tasks and the closure check: the path, not the answers
SOURCE_TOKENS = 1_000_000  # each corpus source read for ~2.5M characters at most
SAMPLE_CHARS = 4_000_000  # the tokenizer's training sample


def rehearsal_config(
    cfg: Config, world_size: int, hardware: tuple[str, int, int] | None = None
) -> Config:
    """The recipe `cfg` at the rehearsal's budgets, for `world_size` ranks: one micro-batch a
    rank per optimizer step, so every timed step is a whole step of the run's shapes.
    `hardware`: (plan.gpu, plan.gpus, plan.hosts) of this host, which the rehearsal's plan
    stage plans for (its memory against this device's, its speed for these devices)."""
    data: dict[str, Any] = cfg.model_dump(mode="python", exclude_unset=True)
    if hardware is not None:
        gpu, gpus, hosts = hardware
        data["plan"] = {**data.get("plan", {}), "gpu": gpu, "gpus": gpus, "hosts": hosts}
    corpus = data.setdefault("corpus", {})
    if cfg.corpus.sources:
        corpus["sources"] = [
            {**source, "read": _bounded(source.get("read", "needed"))}
            for source in corpus["sources"]
        ]
    else:  # a flat list of inputs is read whole: as one source, it is read as far as asked
        corpus.pop("inputs", None)
        corpus["sources"] = [
            {"name": DEFAULT_SOURCE, "inputs": list(cfg.corpus.inputs), "read": SOURCE_TOKENS}
        ]
    tokenizer = data.setdefault("tokenizer", {})
    tokenizer["sample_chars"] = min(cfg.tokenizer.sample_chars, SAMPLE_CHARS)
    pretrain = data.setdefault("pretrain", {})
    pretrain.pop("max_tokens", None)
    pretrain["max_steps"] = PRETRAIN_STEPS
    pretrain["global_batch_tokens"] = cfg.pretrain.seq_len * cfg.pretrain.micro_batch * world_size
    optimizer = data.setdefault("optimizer", {})
    optimizer["warmup_steps"] = min(cfg.optimizer.warmup_steps, WARMUP_STEPS)
    data["logging"] = {
        **data.get("logging", {}),
        "log_every": 1,
        "eval_every": PRETRAIN_STEPS,  # one validation, at the end: the path
        "eval_batches": min(cfg.logging.eval_batches, 2),
        "trackers": [],  # the run's trackers are checked by preflight, not filled by rehearsals
    }
    data["checkpoint"] = {
        **data.get("checkpoint", {}),
        "every": CHECKPOINT_EVERY,
        "every_minutes": 0,
        "keep_last": 2,
        "keep_every": 0,
        # retried as the run retries, without the run's patience: minutes of backoff would
        # only delay the verdict on storage that fails
        "backoff_s": min(cfg.checkpoint.backoff_s, 0.25),
    }
    sft = data.setdefault("sft", {})
    sft.update(
        max_steps=SFT_STEPS,
        heldout=min(cfg.sft.heldout, SFT_HELDOUT),
        closure_max_tokens=min(cfg.sft.closure_max_tokens, MAX_NEW_TOKENS),
        min_closure=0.0,  # a few steps end no answers: the check's path is rehearsed, not its bar
        compare=[],  # the run's own method; compared variants are more of the same path
    )
    sft["checkpoint"] = {**sft.get("checkpoint", {}), "every": SFT_STEPS}
    sft["logging"] = {**sft.get("logging", {}), "log_every": 1}
    evals = data.setdefault("eval", {})
    evals["limit"] = min(cfg.eval.limit or EVAL_ITEMS, EVAL_ITEMS)
    evals["max_new_tokens"] = min(cfg.eval.max_new_tokens, MAX_NEW_TOKENS)
    data.setdefault("decontam", {})["compare_drop"] = False  # the same pipeline once more
    return Config.model_validate(data)


def _bounded(read: Any) -> int:
    """A source's read amount at the rehearsal's budget."""
    return min(read, SOURCE_TOKENS) if isinstance(read, int) else SOURCE_TOKENS
