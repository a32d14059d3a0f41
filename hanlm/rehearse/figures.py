"""Each rehearsed stage's own figures, read from what it wrote in the rehearsal's folder:
the data stages' MB/s per core, pretraining's tokens/s, MFU, peak memory against the plan's and
the seconds a checkpoint takes on this storage, SFT's tokens/s and peak memory, eval's items/s.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from hanlm.config import Config
from hanlm.data.corpus import CorpusStats
from hanlm.plan.data_rates import BYTES_PER_CHAR, effective_cores
from hanlm.plan.estimate import Plan
from hanlm.rehearse.recipe import WARMUP_STEPS
from hanlm.stages.rundir import RunDir
from hanlm.train.checkpoint_layout import WRITE_SECONDS, committed, read_trainer_state
from hanlm.train.results import read_metrics

MB = 1e6


def data_cores(cfg: Config) -> int:
    """The worker processes the data stages ran with here."""
    return cfg.data_engine.workers or os.cpu_count() or 1


def _per_core(nbytes: float, seconds: float, cfg: Config) -> dict[str, Any]:
    cores = data_cores(cfg)
    return {
        "mb": nbytes / MB,
        "cores": cores,
        "mb_per_s_per_core": nbytes / MB / max(seconds, 1e-9) / effective_cores(cores),
    }


def _corpus_bytes(sub: RunDir, out: bool) -> float:
    """The corpus stage's input (raw) or output text, in the planner's bytes (characters x
    BYTES_PER_CHAR: the plan's rates are per byte of Korean text counted so)."""
    stats = CorpusStats.read(sub.corpus_stats)
    return (stats.characters_out if out else stats.characters_in) * BYTES_PER_CHAR


def corpus(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    """Per its own seconds: the stage's wall time also made the demo world, when it reads it."""
    stats = CorpusStats.read(sub.corpus_stats)
    return _per_core(stats.characters_in * BYTES_PER_CHAR, stats.seconds, cfg)


def decontam(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    return _per_core(_corpus_bytes(sub, out=True), seconds, cfg)


def shards(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    return _per_core(_corpus_bytes(sub, out=True), seconds, cfg)


def plan(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    made = Plan.read(sub.plan)
    figures: dict[str, Any] = {}
    if made.time is not None:
        figures["planned_tokens_per_s"] = made.time.tokens_per_s
    if made.memory is not None:
        figures["planned_memory_gb"] = made.memory.total / 1e9
        figures["capacity_gb"] = made.memory.capacity / 1e9
        figures["fits"] = made.memory.fits
    return figures


def pretrain(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    """Tokens/s (over every rank) and MFU, medians of the steps after the warm-up; the peak
    memory of rank 0; each committed checkpoint's seconds from its start to its commit."""
    records = [r for r in read_metrics(sub.pretrain.metrics) if r.step > WARMUP_STEPS]
    timed = [r for r in records if r.val_loss is None]  # a validation step is not a train step
    figures: dict[str, Any] = {"timed_steps": len(timed)}
    if timed:
        figures["tokens_per_s"] = statistics.median(r.tokens_per_s for r in timed)
        mfus = [r.mfu for r in timed if r.mfu is not None]
        figures["mfu"] = statistics.median(mfus) if mfus else None
        figures["peak_memory_gb"] = max(r.peak_memory_gb for r in records)
    made = Plan.read_if_present(sub.plan)
    if made is not None and made.memory is not None:
        figures["planned_memory_gb"] = made.memory.total / 1e9
    writes = [
        read_trainer_state(path).get(WRITE_SECONDS) for path in committed(sub.pretrain.checkpoints)
    ]
    writes = [w for w in writes if w is not None]
    if writes:
        figures["checkpoint_write_s"] = max(writes)
    return figures


def sft(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    records = read_metrics(sub.sft.metrics)
    figures: dict[str, Any] = {"steps": len(records)}
    if records:
        later = records[1:] or records  # the first step builds what it needs
        figures["tokens_per_s"] = statistics.median(r.tokens_per_s for r in later)
        figures["peak_memory_gb"] = max(r.peak_memory_gb for r in records)
    return figures


def eval_(sub: RunDir, seconds: float, cfg: Config) -> dict[str, Any]:
    path = sub.eval_samples
    items = sum(1 for line in path.open(encoding="utf-8") if line.strip()) if path.is_file() else 0
    return {"items": items, "items_per_s": items / max(seconds, 1e-9)}


# stage -> its figures(sub, seconds, rehearsal recipe); the others have seconds alone
FIGURES: dict[str, Callable[[RunDir, float, Config], dict[str, Any]]] = {
    "plan": plan,
    "corpus": corpus,
    "decontam": decontam,
    "shards": shards,
    "pretrain": pretrain,
    "sft": sft,
    "eval": eval_,
}
