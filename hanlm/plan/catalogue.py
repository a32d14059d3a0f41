"""The GPU catalogue (memory, dense tensor throughput, bandwidth, interconnect) and peak lookup.

Throughput figures are dense (no 2:4 sparsity) tensor-core TFLOPS with FP32 accumulation, the
figure a training matmul gets; GeForce cards run FP16/BF16 with FP32 accumulation at half their
headline FP16-accumulate rate. The planner and the MFU figure read them from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hanlm.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    memory_gb: float  # usable device memory, GB (1e9 bytes)
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores
    memory_bandwidth_gbs: float
    interconnect: str
    interconnect_gbs: float  # per-GPU bandwidth to its peers, one direction, GB/s
    compute_capability: tuple[int, int]
    match: tuple[str, ...]  # substrings of torch.cuda.get_device_name() that identify it


CATALOGUE: dict[str, GPU] = {
    # NVIDIA Ada GPU architecture whitepaper v2.1, appendix table (GeForce RTX 4090):
    # FP16/BF16 tensor with FP32 accumulate 165.2 dense, FP8 with FP32 accumulate 330.3 dense;
    # 1,008 GB/s GDDR6X; PCIe 4.0 x16 (~32 GB/s), no NVLink.
    "rtx4090": GPU(
        "rtx4090", "GeForce RTX 4090", 24, 165.2, 330.3, 1008, "PCIe 4.0 x16", 32, (8, 9), ("4090",)
    ),
    # NVIDIA RTX Blackwell GPU architecture whitepaper, table 2 (GeForce RTX 5090):
    # FP16/BF16 with FP32 accumulate 209.5 dense, FP8 419 dense; 1,792 GB/s GDDR7; PCIe 5.0 x16.
    "rtx5090": GPU(
        "rtx5090",
        "GeForce RTX 5090",
        32,
        209.5,
        419.0,
        1792,
        "PCIe 5.0 x16",
        64,
        (12, 0),
        ("5090",),
    ),
    # NVIDIA L40S datasheet: BF16 362.05 dense (733 sparse), FP8 733 dense; 864 GB/s; PCIe 4.0.
    "l40s": GPU("l40s", "L40S", 48, 362.05, 733.0, 864, "PCIe 4.0 x16", 32, (8, 9), ("L40S",)),
    # NVIDIA A100 datasheet: BF16 312 dense, no FP8; 40 GB HBM2 1,555 GB/s / 80 GB HBM2e
    # 2,039 GB/s (SXM); NVLink 3 600 GB/s total (300 GB/s each direction).
    "a100-40gb": GPU(
        "a100-40gb",
        "A100 40GB",
        40,
        312.0,
        None,
        1555,
        "NVLink 3",
        300,
        (8, 0),
        ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"),
    ),
    "a100-80gb": GPU(
        "a100-80gb",
        "A100 80GB",
        80,
        312.0,
        None,
        2039,
        "NVLink 3",
        300,
        (8, 0),
        ("A100-SXM4-80GB", "A100 80GB", "A100-PCIE-80GB"),
    ),
    # NVIDIA H100 datasheet (SXM5): BF16 989.4 dense, FP8 1,978.9 dense; 3.35 TB/s HBM3;
    # NVLink 4 900 GB/s total (450 GB/s each direction).
    "h100": GPU(
        "h100", "H100 SXM 80GB", 80, 989.4, 1978.9, 3350, "NVLink 4", 450, (9, 0), ("H100",)
    ),
    # NVIDIA H200 datasheet (SXM): compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s; NVLink 4.
    "h200": GPU(
        "h200", "H200 SXM 141GB", 141, 989.4, 1978.9, 4800, "NVLink 4", 450, (9, 0), ("H200",)
    ),
    # NVIDIA DGX B200 datasheet (8 GPUs: 72 PFLOPS FP8 training, 1,440 GB, 64 TB/s) and HGX B200
    # specs: per GPU BF16 2,250 dense, FP8 4,500 dense, 180 GB HBM3e, 8 TB/s; NVLink 5 1.8 TB/s.
    "b200": GPU(
        "b200", "B200 180GB", 180, 2250.0, 4500.0, 8000, "NVLink 5", 900, (10, 0), ("B200",)
    ),
}


# Rental prices, USD per GPU-hour (spot, on-demand): RunPod's typical rates as listed by
# deploybase.ai, "RunPod GPU Pricing: 2026 Comprehensive Pricing Guide" (March 2026); A100 40GB
# is no longer listed there. Prices move by the week and differ by provider: the plan shows
# which one it used, and plan.price_per_gpu_hour (or launch.spot_price_per_gpu_hour) overrides.
PRICES_SOURCE = "RunPod's typical rates, March 2026 (deploybase.ai)"
PRICES: dict[str, tuple[float, float]] = {
    "rtx4090": (0.34, 0.60),
    "rtx5090": (0.69, 1.22),
    "l40s": (0.79, 1.40),
    "a100-80gb": (1.39, 2.45),
    "h100": (2.69, 4.76),
    "h200": (3.59, 6.35),
    "b200": (5.98, 10.57),
}


def price_per_gpu_hour(key: str, *, spot: bool) -> float | None:
    """The catalogue's rental price of one `key` GPU for an hour, or None when it has none."""
    prices = PRICES.get(key)
    return None if prices is None else prices[0 if spot else 1]


def find(key_or_name: str) -> GPU:
    """A catalogue entry by key ("rtx5090") or by a device name ("NVIDIA GeForce RTX 5090")."""
    key = key_or_name.strip().lower().replace(" ", "").replace("_", "-")
    if key in CATALOGUE:
        return CATALOGUE[key]
    for gpu in CATALOGUE.values():
        if any(m.lower() in key_or_name.lower() for m in gpu.match):
            return gpu
    raise UserError(
        f"unknown GPU {key_or_name!r}",
        fix=f"use one of {', '.join(CATALOGUE)}",
    )


_cpu_peak_cache: dict[torch.dtype, float] = {}
_PEAK_MATMUL_SIZE = 1536  # large enough for the CPU's best kernel, small enough for a laptop


def measured_cpu_peak_flops(dtype: torch.dtype | None = None, seconds: float = 0.5) -> float:
    """FLOP/s of the fastest of repeated square matmuls on this CPU (in `dtype`, by default
    float32), measured once per process."""
    import torch  # deferred: the planner and the report card, which import this, need no torch

    dtype = torch.float32 if dtype is None else dtype
    if dtype not in _cpu_peak_cache:
        # the largest size up to 1536 whose one matmul takes a fraction of the time allowed: a
        # dtype without a fast path here (bfloat16 on AVX2: ~1 GFLOP/s) took 10 s per 1536 call
        n = 256
        while True:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            start = time.perf_counter()
            torch.mm(a, b)  # warm-up at this size: thread pool and caches
            took = time.perf_counter() - start
            bigger = min(2 * n, _PEAK_MATMUL_SIZE)
            if n == _PEAK_MATMUL_SIZE or took * (bigger / n) ** 3 > seconds / 4:
                break
            n = bigger
        best, deadline = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        _cpu_peak_cache[dtype] = 2 * n**3 / best
    return _cpu_peak_cache[dtype]


def device_peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """Peak FLOP/s for MFU on `device` at `precision`, and where the figure comes from."""
    import torch  # deferred: as in measured_cpu_peak_flops

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        try:
            gpu = find(name)
        except UserError:
            return float("nan"), f"{name} is not in the catalogue"
        if precision == "fp8" and gpu.fp8_tflops:
            return gpu.fp8_tflops * 1e12, f"catalogue: {gpu.name} FP8 dense"
        return gpu.bf16_tflops * 1e12, f"catalogue: {gpu.name} BF16 dense"
    if precision != "bf16":
        return measured_cpu_peak_flops(torch.float32), "measured CPU float32 matmul"
    # A CPU without a fast bf16 path runs a large bf16 matmul far below float32 (0.76 against
    # 133 GFLOP/s on an AVX2 AMD EPYC), while training's small ones take faster paths: the
    # faster of the two is the peak, else MFU reads over 100%.
    bf16, fp32 = measured_cpu_peak_flops(torch.bfloat16), measured_cpu_peak_flops(torch.float32)
    if bf16 >= fp32:
        return bf16, "measured CPU bfloat16 matmul"
    return fp32, "measured CPU float32 matmul (faster here than bfloat16)"
