"""Data loading: tokens per second this rank reads from a shards folder.

The training loader reads in the training process between steps, so its rate must stay well
above what a step consumes; the verdict compares the two.
"""

from __future__ import annotations

import time
from pathlib import Path

from hanlm.config import Config
from hanlm.data.loader import TokenLoader
from hanlm.data.manifest import MANIFEST_NAME
from hanlm.errors import UserError

MIN_BATCHES = 3


WITHOUT_SHARDS = "run `hanlm shards` first"  # what to do when there are none yet, by default


def measure(
    cfg: Config, shards_dir: Path, *, rank: int, world_size: int, seconds: float,
    without_shards: str = WITHOUT_SHARDS,
) -> dict:  # fmt: skip
    """`without_shards`: what the note says to do when there are none yet."""
    if not (shards_dir / MANIFEST_NAME).is_file():
        return {"skipped": f"no shards yet in {shards_dir} ({without_shards})"}
    pretrain_cfg = cfg.pretrain
    try:
        loader = TokenLoader.from_shards(
            shards_dir,
            "train",
            seq_len=pretrain_cfg.seq_len,
            micro_batch=pretrain_cfg.micro_batch,
            rank=rank,
            world_size=world_size,
            seed=cfg.run.seed,
        )
    except UserError as e:
        return {"error": e.message}
    batches, start = 0, time.perf_counter()
    deadline = start + seconds
    while batches < MIN_BATCHES or time.perf_counter() < deadline:
        loader.next_batch()
        batches += 1
    elapsed = time.perf_counter() - start
    tokens = batches * pretrain_cfg.micro_batch * pretrain_cfg.seq_len
    return {"batches": batches, "tokens": tokens, "tokens_per_s": tokens / elapsed}
