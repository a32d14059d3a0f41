"""`hanlm plan`: will it fit, how long, how much, before any GPU is rented.

The plan of one setup (hanlm.plan.inputs): its memory per device (hanlm.plan.memory_model), its
time and cost (hanlm.plan.time_model), and the cheapest configuration that fits among the
candidates compared; without a GPU chosen, for each GPU of the catalogue the fewest that fit.
`Plan` is the result, `plan/plan.json`; hanlm.plan.recipe makes the plan of a run's recipe.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hanlm.plan.catalogue import CATALOGUE
from hanlm.plan.data_rates import data_time
from hanlm.plan.inputs import RECOMPUTE_MODES, Setup, Shapes, check, model_shapes
from hanlm.plan.memory_model import GIB, MemoryPlan, memory
from hanlm.plan.time_model import TimePlan, throughput
from hanlm.results import Part, Result


class ModelSize(Part):
    parameters: int
    layers: int
    hidden: int
    vocab: int


class PlanOption(Part):
    """One configuration the recommendation compares."""

    gpus: int
    hosts: int
    parallel: str
    recompute: str
    micro_batch: int
    memory_gib: float
    margin_gib: float
    tokens_per_s: float
    gpu_hours: float | None = None
    wall_hours: float | None = None
    cost: float | None = None


class Recommendation(Part):
    best: PlanOption
    alternatives: list[PlanOption]


class Plan(Result):
    """`plan/plan.json`: the setup planned, the model's size, and either the memory, time and
    recommendation for the chosen GPU or (no GPU chosen) the catalogue's `options`; the data
    stages' time when the setup sizes them."""

    FILE = "plan.json"
    MADE_BY = "plan"

    setup: Setup
    model: ModelSize
    data: dict[str, Any] | None = None  # hanlm.plan.data_rates.data_time
    mixture: list[dict[str, Any]] | None = None  # hanlm.data.mixture.preview, for sources mixed
    options: list[dict[str, Any]] | None = None  # catalogue_overview, without a GPU
    memory: MemoryPlan | None = None
    time: TimePlan | None = None
    recommendation: Recommendation | None = None
    sft: dict[str, Any] | None = None  # sft_memory: SFT's memory per GPU, full and LoRA


def make_plan(setup: Setup) -> Plan:
    check(setup)
    shapes = model_shapes(setup.model, vocab_size=setup.vocab_size, seq_len=setup.seq_len)
    plan: dict[str, Any] = {
        "setup": setup,
        "model": {
            "parameters": shapes.n_params,
            "layers": shapes.layers,
            "hidden": shapes.hidden,
            "vocab": shapes.vocab,
        },
    }
    if setup.data is not None:
        plan["data"] = data_time(setup.data)
    if setup.gpu is None:
        plan["options"] = catalogue_overview(setup, shapes)
        return Plan.model_validate(plan)
    plan["memory"] = memory(setup, shapes)
    plan["time"] = throughput(setup, shapes)
    plan["recommendation"] = recommend(setup, shapes)
    return Plan.model_validate(plan)


def candidates(setup: Setup) -> list[Setup]:
    """The configurations the recommendation compares: 1, 2, 4, 8 and the given number of GPUs
    per host, each parallelism, each recomputation, micro-batches halving from the given one."""
    counts = [1] if setup.gpu == "cpu" else sorted({1, 2, 4, 8, setup.gpus})
    micro = sorted({max(1, setup.micro_batch >> k) for k in range(6)})
    out = []
    for gpus in counts:
        for parallel in ("single",) if gpus * setup.hosts == 1 else ("ddp", "fsdp"):
            for recompute in RECOMPUTE_MODES:
                for mb in micro:
                    out.append(
                        replace(
                            setup, gpus=gpus, parallel=parallel, recompute=recompute, micro_batch=mb
                        )
                    )
    return out


def recommend(setup: Setup, shapes: Shapes) -> dict[str, Any] | None:
    """The cheapest fitting candidate (by GPU-hours, then wall time), and the runners-up."""
    rows = []
    for option in candidates(setup):
        mem = memory(option, shapes)
        if not mem.fits:
            continue
        timing = throughput(option, shapes)
        gpu_seconds = timing.step_s * option.world / timing.tokens_per_step  # per token
        rows.append((gpu_seconds, timing.step_s / timing.tokens_per_step, option, mem, timing))
    if not rows:
        return None
    # Equal cost: the faster run, then the larger micro-batch (the planner's MFU does not
    # model small batches' lower efficiency), then the larger margin.
    rows.sort(key=lambda row: (row[0], row[1], -row[2].micro_batch, -row[3].margin))

    def describe(row) -> dict[str, Any]:
        _, _, option, mem, timing = row
        out = {
            "gpus": option.gpus,
            "hosts": option.hosts,
            "parallel": option.parallel,
            "recompute": option.recompute,
            "micro_batch": option.micro_batch,
            "memory_gib": mem.total / GIB,
            "margin_gib": mem.margin / GIB,
            "tokens_per_s": timing.tokens_per_s,
        }
        for key in ("gpu_hours", "wall_hours", "cost"):
            if getattr(timing, key) is not None:
                out[key] = getattr(timing, key)
        return out

    return {"best": describe(rows[0]), "alternatives": [describe(row) for row in rows[1:4]]}


def catalogue_overview(setup: Setup, shapes: Shapes) -> list[dict[str, Any]]:
    """Without a GPU: for each catalogue GPU, the fewest that fit with FSDP and the GPU-hours."""
    rows = []
    for key, gpu in CATALOGUE.items():
        row: dict[str, Any] = {"gpu": key, "name": gpu.name, "memory_gb": gpu.memory_gb}
        if setup.precision == "fp8" and gpu.fp8_tflops is None:
            row["note"] = "no FP8"
            rows.append(row)
            continue
        for n in (1, 2, 4, 8, 16, 32, 64):
            option = replace(
                setup, gpu=key, gpus=n, hosts=1, parallel="single" if n == 1 else "fsdp"
            )
            if memory(option, shapes).fits:
                row["min_gpus"] = n
                if setup.tokens:
                    row["gpu_hours"] = throughput(option, shapes).gpu_hours
                break
        rows.append(row)
    return rows
