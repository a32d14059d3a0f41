"""`hanlm plan`'s time and cost model: how long, how much, before any GPU is rented.

Time: FLOPs per token (6·N by the field report's rule, or hanlm's exact count with attention)
times tokens, at a model FLOPs utilisation (MFU) per GPU class, plus the communication that
compute does not hide. Cost: GPU-hours times the hourly price.
"""

from __future__ import annotations

import math
from typing import Any

from hanlm.errors import UserError
from hanlm.plan.catalogue import find, measured_cpu_peak_flops
from hanlm.plan.inputs import Setup, Shapes
from hanlm.results import Part

COMM_OVERLAP = 0.8  # share of compute time that can hide communication (bucketed, prefetched)
# forward run again, by hanlm.plan.inputs.RECOMPUTE_MODES
RECOMPUTE_COST = {"none": 1.0, "selective": 1.05, "full": 4 / 3}
# The token budget is the recipe's whatever the optimizer: a token-efficiency factor is applied
# only where one was measured at the scale planned, and none is (benchmarks/README.md, optimizer).
MUON_TOKENS_NOTE = (
    "Muon: the tokens as given, no token-efficiency factor (benchmarks/optimizer.py measured "
    "only 1-4M-parameter models; Wen et al. 2025 found ~1.1x at 1.2B)"
)

# Realistic bf16 MFU by class (of the dense BF16 peak): NVLink boards with mature kernels reach
# 40-50%; consumer and PCIe cards lose more to host overhead and slower links. (hanlm measured 54%
# for `1.3b` and 42% for `350m` on one H200, compiled, seq 2,048 x 16: benchmarks/gpu_train.py;
# the planning figures stay below that for several GPUs.) FP8 GEMMs run at twice the bf16 rate but
# the rest of the step does not: torchtitan reports ~1.3-1.5x end to end on H100 for 8B models;
# hanlm measured 1.18x at `1.3b` and 1.01x at `350m` on one H200, whose matmuls are smaller. The
# FP8 default is 0.6x the bf16 MFU against the FP8 peak (1.2x the bf16 tokens/s).
DEFAULT_BF16_MFU = {
    "rtx4090": 0.35,
    "rtx5090": 0.40,  # the field report's planning figure
    "l40s": 0.35,
    "a100-40gb": 0.45,
    "a100-80gb": 0.45,
    "h100": 0.40,
    "h200": 0.40,
    "b200": 0.35,
}
FP8_MFU_FACTOR = 0.6
CPU_MFU = 0.5  # against the measured matmul peak of this CPU


def default_mfu(gpu: str | None, precision: str) -> tuple[float, str]:
    if gpu == "cpu" or gpu is None:
        return CPU_MFU, "CPU: half the measured matmul peak"
    key = find(gpu).key
    bf16 = DEFAULT_BF16_MFU[key]
    if precision == "fp8":
        return bf16 * FP8_MFU_FACTOR, f"{bf16:.0%} bf16 x {FP8_MFU_FACTOR} for FP8 (of FP8 peak)"
    return bf16, f"typical bf16 MFU for {find(gpu).name}"


def peak_flops(gpu: str | None, precision: str) -> float:
    if gpu == "cpu" or gpu is None:
        return measured_cpu_peak_flops()
    entry = find(gpu)
    if precision == "fp8":
        if entry.fp8_tflops is None:
            raise UserError(
                f"{entry.name} has no FP8 tensor cores",
                fix="use --precision bf16, or a GPU of compute capability 8.9+ (Ada, Hopper, "
                "Blackwell)",
            )
        return entry.fp8_tflops * 1e12
    if precision == "fp32":
        return entry.bf16_tflops * 1e12 / 2  # TF32 tensor cores: half the bf16 rate
    return entry.bf16_tflops * 1e12


def link_bytes_per_s(setup: Setup) -> tuple[float, str]:
    """The slowest link of the ring: the GPUs' interconnect, or the hosts' network."""
    if setup.gpu in (None, "cpu"):
        return 10e9, "host memory"
    entry = find(setup.gpu)
    intra = entry.interconnect_gbs * 1e9
    if setup.hosts > 1:
        inter = setup.inter_host_gbps * 1e9 / 8
        if inter < intra:
            return inter, f"{setup.inter_host_gbps:g} Gbit/s between hosts"
    return intra, entry.interconnect


def comm_bytes_per_step(shapes: Shapes, setup: Setup, accumulation: int) -> float:
    """Bytes each rank sends per optimizer step (ring algorithms: (n-1)/n of the payload per
    all-gather or reduce-scatter, twice that per all-reduce)."""
    n = setup.world
    if n == 1 or setup.parallel == "single":
        return 0.0
    share = (n - 1) / n
    if setup.parallel == "ddp":  # one float32 gradient all-reduce per step (no_sync before)
        return 2 * share * 4 * shapes.n_params
    param_bytes = 4 if setup.precision == "fp32" else 2
    # per micro-step: parameters gathered for forward and again for backward, float32
    # gradients reduce-scattered
    per_step = accumulation * share * (2 * param_bytes * shapes.n_params + 4 * shapes.n_params)
    if setup.optimizer == "muon" and not setup.lora:  # each block matrix's update gathered whole
        per_step += share * 4 * shapes.matmul_weights_in_blocks
    return per_step


class TimePlan(Part):
    """One optimizer step's time and the throughput; with a token budget, hours and cost."""

    mfu: float
    mfu_source: str
    peak_flops_per_gpu: float
    flops_per_token_6n: int
    flops_per_token_with_attention: int
    attention_adds: float
    tokens_per_step: int
    accumulation: int
    compute_s: float
    comm_s: float
    comm_link: str
    exposed_comm_s: float
    step_s: float
    tokens_per_s: float
    steps: int | None = None
    wall_hours: float | None = None
    gpu_hours: float | None = None
    gpu_hours_with_attention: float | None = None
    cost: float | None = None
    cost_with_attention: float | None = None
    optimizer_note: str | None = None  # what the token budget assumes of the optimizer


def throughput(setup: Setup, shapes: Shapes) -> TimePlan:
    tokens_per_micro = setup.seq_len * setup.micro_batch * setup.world
    global_batch = setup.global_batch_tokens or tokens_per_micro
    accumulation = max(1, math.ceil(global_batch / tokens_per_micro))
    tokens_per_step = accumulation * tokens_per_micro
    mfu, mfu_source = (setup.mfu, "given") if setup.mfu else default_mfu(setup.gpu, setup.precision)
    peak = peak_flops(setup.gpu, setup.precision)
    six_n = shapes.flops["six_n"]
    compute_s = (
        tokens_per_step * six_n * RECOMPUTE_COST[setup.recompute] / (setup.world * peak * mfu)
    )
    link, link_name = link_bytes_per_s(setup)
    comm_s = comm_bytes_per_step(shapes, setup, accumulation) / link
    exposed = max(0.0, comm_s - COMM_OVERLAP * compute_s)
    step_s = compute_s + exposed
    if setup.measured_tokens_per_s:  # a rehearsal timed these shapes here: its speed, all in
        step_s = tokens_per_step / setup.measured_tokens_per_s
        mfu = min(1.0, setup.measured_tokens_per_s * six_n / (setup.world * peak))
        mfu_source = f"measured: {setup.measured_by}"
        compute_s, exposed = step_s, 0.0
    out: dict[str, Any] = {
        "mfu": mfu,
        "mfu_source": mfu_source,
        "peak_flops_per_gpu": peak,
        "flops_per_token_6n": six_n,
        "flops_per_token_with_attention": shapes.flops["total"],
        "attention_adds": shapes.flops["total"] / six_n - 1,  # exact count with attention vs 6·N
        "tokens_per_step": tokens_per_step,
        "accumulation": accumulation,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "comm_link": link_name,
        "exposed_comm_s": exposed,
        "step_s": step_s,
        "tokens_per_s": tokens_per_step / step_s,
    }
    if setup.optimizer == "muon" and not setup.lora:
        out["optimizer_note"] = MUON_TOKENS_NOTE
    if setup.tokens:
        steps = setup.tokens / tokens_per_step
        wall_s = steps * step_s
        gpu_hours = wall_s * setup.world / 3600
        out.update(steps=math.ceil(steps), wall_hours=wall_s / 3600, gpu_hours=gpu_hours)
        # the same run counted with attention FLOPs at the same MFU
        out["gpu_hours_with_attention"] = gpu_hours * shapes.flops["total"] / six_n
        if setup.price_per_gpu_hour is not None:
            out["cost"] = gpu_hours * setup.price_per_gpu_hour
            out["cost_with_attention"] = out["gpu_hours_with_attention"] * setup.price_per_gpu_hour
    return TimePlan.model_validate(out)
