"""hanlm's own pretraining on random tokens, for the benchmarks that measure it at real size.

Shared by `gpu_train.py` and `rehearsal_350m.py`: shards of random token ids with the manifest
the loader checks (no corpus or tokenizer needed), the run's recipe as a `Config`, one call of
`hanlm.train.pretrain.pretrain` (the same model build, precision plan, parallelisation, Trainer
and loader a real run uses), its metrics, and what `hanlm plan` predicts for the same setup.
Not a script: the benchmarks load it by path (this folder is kept off the import path).
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

RANDOM_TOKENIZER = "random-token-ids"  # stands in for the tokenizer's sha256 in the manifest
TRAIN_FILE = "train-00000.bin"


def write_random_shards(folder: Path, *, vocab_size: int, tokens: int, seed: int = 0) -> Path:
    """A shards folder holding one train file of `tokens` uniformly random ids and its manifest
    (no validation split: pretraining then trains without one)."""
    from hanlm.data.manifest import MANIFEST_FORMAT, MANIFEST_NAME

    dtype = np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(seed).integers(0, vocab_size, size=tokens, dtype=np.int64)
    ids.astype(dtype).tofile(folder / TRAIN_FILE)
    train = {
        "files": [{"path": TRAIN_FILE, "source": "corpus", "tokens": tokens}],
        "tokens": tokens,
    }
    manifest = {
        "format": MANIFEST_FORMAT,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "tokenizer_sha256": RANDOM_TOKENIZER,
        "splits": {"train": train},
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return folder


def recipe(
    *,
    preset: str,
    vocab_size: int,
    seq_len: int,
    micro_batch: int,
    world_size: int,
    total_steps: int,
    precision: str,
    compile_blocks: bool,
    activation_checkpointing: str,
    parallel: str,
    device: str,
    log_every: int,
    checkpoint_every: int = 0,
    seed: int = 0,
    optimizer: str = "adamw",
):
    """The Config of a pretraining run: one micro-step per optimizer step on every rank."""
    from hanlm.config import Config

    return Config.model_validate(
        {
            "run": {"seed": seed},
            "model": {"preset": preset},
            "tokenizer": {"vocab_size": vocab_size},
            "pretrain": {
                "seq_len": seq_len,
                "micro_batch": micro_batch,
                "global_batch_tokens": seq_len * micro_batch * world_size,
                "max_steps": total_steps,
            },
            "precision": {"mode": precision},
            "optimizer": {"name": optimizer},
            "parallel": {
                "mode": parallel,
                "device": device,
                "activation_checkpointing": activation_checkpointing,
                "compile": compile_blocks,
            },
            # validation only at the last step, which the benchmarks stop short of
            "logging": {"log_every": log_every, "eval_every": 0, "eval_batches": 1},
            "checkpoint": {"every": checkpoint_every, "every_minutes": 0, "keep_last": 1},
        }
    )


@dataclass(frozen=True)
class Outputs:
    """Where the run writes (what hanlm.train.pretrain.PretrainOutputs asks for)."""

    checkpoints: Path
    metrics: Path
    place: str = "benchmark/pretrain"  # its folder under a checkpoint mirror (none is set)


def outputs(folder: Path) -> Outputs:
    return Outputs(folder / "checkpoints", folder / "metrics.jsonl")


def train(
    cfg, shards: Path, folder: Path, *, stop_after_steps: int | None = None, fresh: bool = True
):  # -> hanlm.train.results.PretrainSummary
    """hanlm's pretraining of `cfg` on the random shards; `fresh=False` resumes from the latest
    checkpoint in `folder`."""
    from hanlm.train.pretrain import PretrainData, pretrain

    vocab = cfg.tokenizer.vocab_size
    data = PretrainData(
        shards_dir=shards,
        shards_fingerprint=f"{RANDOM_TOKENIZER}:{vocab}",
        vocab_size=vocab,
        tokenizer_sha256=RANDOM_TOKENIZER,
        tokenizer_dir=shards,  # read only by distillation, which is off
        token_byte_lengths=[1] * vocab,  # only validation's bits per byte reads them
    )
    return pretrain(
        cfg,
        data,
        outputs(folder),
        settings_fp="benchmark",
        force=fresh,
        stop_after_steps=stop_after_steps,
    )


def read_metrics(path: Path) -> list[dict]:
    """The step records of metrics.jsonl (rank 0 writes it)."""
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in records if "tokens_per_s" in r]


def steady_state(records: list[dict], skip_windows: int = 1) -> dict[str, float]:
    """Tokens/s over the log windows after the first `skip_windows` (warm-up and compile), from
    each window's token count and rate; and the seconds the skipped windows took."""
    windows, previous = [], 0
    for r in records:
        tokens = r["tokens"] - previous
        previous = r["tokens"]
        windows.append((tokens, tokens / r["tokens_per_s"] if r["tokens_per_s"] else 0.0))
    warm, timed = windows[:skip_windows], windows[skip_windows:]
    tokens, seconds = sum(t for t, _ in timed), sum(s for _, s in timed)
    return {
        "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
        "timed_tokens": tokens,
        "timed_s": seconds,
        "warmup_s": sum(s for _, s in warm),
    }


def planned_memory(cfg, *, gpu: str | None, world_size: int) -> dict[str, Any]:
    """`hanlm plan`'s itemised memory per rank for the recipe on `world_size` ranks of `gpu` (a
    catalogue key, "cpu", or None for a GPU the catalogue lacks): the setup `hanlm plan
    --config` derives from the same recipe, and hanlm.plan.memory_model.memory's answer."""
    from hanlm.config import PlanSection
    from hanlm.plan.memory_model import memory
    from hanlm.plan.recipe import setup_from_config

    setup = setup_from_config(
        cfg, plan_section=PlanSection(gpu=gpu, gpus=world_size), with_data=False
    )
    out = memory(setup)
    return {"setup": asdict(setup), "items": out.items, "total": out.total}


def peak_rss_bytes() -> int:
    """This process's peak resident memory (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
