"""`hanlm rehearse --tune`: pretraining, the cost driver, timed at the candidates the planner says
fit on this device, a few steps each, and the fastest that fits kept.

The candidates: the recipe's micro-batch doubled while the plan's memory for it stays within
`HEADROOM` of the device; at the largest of those, activation checkpointing (which frees memory
for a micro-batch twice as large, when the plan says that one fits) and compile switched. Each
runs `TUNE_STEPS` steps through the pipeline's pretrain stage in `RUN/rehearsal/tune/NAME`, on
the rehearsal's shards; a candidate fits when it ran and its measured peak memory stays within
`HEADROOM` of the device too. Every candidate's tokens/s and peak memory are recorded.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from hanlm import pipeline, ranks
from hanlm.config import Config
from hanlm.console import info
from hanlm.plan.inputs import model_shapes
from hanlm.plan.memory_model import memory
from hanlm.plan.recipe import planned_parallel, setup_from_config
from hanlm.rehearse import figures
from hanlm.rehearse.faults import STOPS, classify
from hanlm.rehearse.recipe import WARMUP_STEPS, rehearsal_config
from hanlm.rehearse.resume import link_shared
from hanlm.stages.rundir import TUNE, RunDir

HEADROOM = 0.9  # of the device's memory: what a candidate may plan for, and peak at
TUNE_STEPS = WARMUP_STEPS + 5  # five timed steps a candidate
MAX_DOUBLINGS = 4


def _world() -> int:
    return ranks.world_size()


def device_capacity_gb() -> float:
    """This device's memory (a GPU's, else the machine's RAM), in GB."""
    import torch  # deferred: torch

    if torch.cuda.is_available():
        local = ranks.local_rank()
        return torch.cuda.get_device_properties(local).total_memory / 1e9
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def _planned_gb(cfg: Config, micro_batch: int, recompute: str) -> float:
    setup = setup_from_config(cfg, with_data=False)
    setup = replace(
        setup, micro_batch=micro_batch, recompute=recompute, gpus=_world(), hosts=1,
        parallel=planned_parallel(cfg.parallel.mode, _world()),
    )  # fmt: skip
    shapes = model_shapes(setup.model, vocab_size=setup.vocab_size, seq_len=setup.seq_len)
    return memory(setup, shapes).total / 1e9


def candidates(cfg: Config, capacity_gb: float) -> list[dict[str, Any]]:
    """(micro_batch, activation checkpointing, compile) to time, the recipe's first, with the
    plan's memory of each; those the plan puts over HEADROOM are left out."""
    recompute = cfg.parallel.activation_checkpointing
    compiled = setup_from_config(cfg, with_data=False).compiled
    limit = HEADROOM * capacity_gb
    doubled: list[dict[str, Any]] = []
    micro = cfg.pretrain.micro_batch
    for _ in range(MAX_DOUBLINGS + 1):
        planned = _planned_gb(cfg, micro, recompute)
        if doubled and planned > limit:
            break
        doubled.append({"micro_batch": micro, "recompute": recompute, "compile": compiled,
                        "planned_gb": planned})  # fmt: skip
        micro *= 2
    largest = doubled[-1]
    out = [*doubled, {**largest, "compile": not compiled}]
    for other in ("selective", "full"):  # less memory: twice the largest micro-batch
        planned = _planned_gb(cfg, 2 * largest["micro_batch"], other)
        if other != recompute and planned <= limit:
            out.append({**largest, "micro_batch": 2 * largest["micro_batch"], "recompute": other,
                        "planned_gb": planned})  # fmt: skip
            break
    return out


def _name(c: dict[str, Any]) -> str:
    return f"mb{c['micro_batch']}-{c['recompute']}-{'compiled' if c['compile'] else 'eager'}"


def _recipe(cfg: Config, c: dict[str, Any]) -> Config:
    base = cfg.model_copy(
        update={
            "pretrain": cfg.pretrain.model_copy(update={"micro_batch": c["micro_batch"]}),
            "parallel": cfg.parallel.model_copy(
                update={"activation_checkpointing": c["recompute"], "compile": c["compile"]}
            ),
        },
        deep=True,
    )
    derived = rehearsal_config(base, _world())
    return derived.model_copy(
        update={
            "pretrain": derived.pretrain.model_copy(update={"max_steps": TUNE_STEPS}),
            "checkpoint": derived.checkpoint.model_copy(
                update={"every": TUNE_STEPS, "mirror": None}
            ),
        },
        deep=True,
    )


def _time(cfg: Config, sub: RunDir, c: dict[str, Any], capacity_gb: float) -> dict[str, Any]:
    folder = RunDir(sub.root / TUNE / _name(c))
    link_shared(sub, folder)
    try:
        pipeline.run_stage("pretrain", _recipe(cfg, c), folder, force=True, save_config=False)
    except STOPS:
        raise
    except BaseException as e:
        return {**c, "name": _name(c), "fits": False, "error": classify(e)[1]}
    measured = figures.pretrain(folder, 0.0, cfg) if ranks.is_main() else {}
    peak = measured.get("peak_memory_gb")
    fits = peak is None or peak <= HEADROOM * capacity_gb
    return {**c, "name": _name(c), "fits": fits, **measured}


def _set_line(cfg: Config, best: dict[str, Any]) -> str:
    changes = {
        "pretrain.micro_batch": (cfg.pretrain.micro_batch, best["micro_batch"]),
        "parallel.activation_checkpointing": (
            cfg.parallel.activation_checkpointing,
            best["recompute"],
        ),
        "parallel.compile": (setup_from_config(cfg, with_data=False).compiled, best["compile"]),
    }
    parts = [
        f"--set {key}={str(new).lower() if isinstance(new, bool) else new}"
        for key, (old, new) in changes.items()
        if old != new
    ]
    per_pass = cfg.pretrain.seq_len * best["micro_batch"] * _world()
    if cfg.pretrain.global_batch_tokens % per_pass:
        fitting = max(per_pass, round(cfg.pretrain.global_batch_tokens / per_pass) * per_pass)
        parts.append(f"--set pretrain.global_batch_tokens={fitting}")
    return " ".join(parts) or "(the recipe's own settings are the fastest)"


def tune(cfg: Config, sub: RunDir) -> dict[str, Any]:
    """Every candidate's figures and the fastest that fits, with the --set line adopting it."""
    capacity = device_capacity_gb()
    timed = []
    for c in candidates(cfg, capacity):
        info(f"tune: {_name(c)} (plan {c['planned_gb']:.2f} GB of {capacity:.1f} GB)")
        timed.append(_time(cfg, sub, c, capacity))
    fitting = [c for c in timed if c["fits"] and c.get("tokens_per_s")]
    if not fitting:
        return {"candidates": timed, "winner": None}
    best = max(fitting, key=lambda c: c["tokens_per_s"])
    recipe = next(c for c in timed if c["name"] == _name(timed[0]))
    why = f"{best['tokens_per_s']:,.0f} tokens/s"
    if recipe.get("tokens_per_s"):
        why += f", {best['tokens_per_s'] / recipe['tokens_per_s']:.2f}x the recipe's"
    winner = {"name": best["name"], "set": _set_line(cfg, best), "why": why}
    return {"candidates": timed, "winner": winner}
