"""Devices of this process: name, memory, compute capability, what it allows, a matmul test.

A GPU's matmul throughput is compared with its catalogue peak (dense BF16); a CPU's is only
reported (its "peak" in the catalogue is itself a measurement).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from hanlm.errors import UserError
from hanlm.plan.catalogue import find, measured_cpu_peak_flops

FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper onwards have FP8 tensor cores


def driver_version() -> str | None:
    """The NVIDIA driver version, from NVML when installed, else the kernel module's banner."""
    try:
        import pynvml  # deferred: optional, GPU hosts only

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML: fall back to the kernel module
        pass
    banner = Path("/proc/driver/nvidia/version")
    if banner.is_file():
        for word in banner.read_text().split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    return None


def _time_cuda_matmul(device: torch.device, seconds: float) -> float:
    """Best FLOP/s of square BF16 matmuls on one GPU during `seconds`."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)  # warm-up: cuBLAS picks its kernel
    torch.cuda.synchronize(device)
    best, deadline = float("inf"), time.perf_counter() + seconds
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    while time.perf_counter() < deadline:
        start_event.record()
        for _ in range(5):  # several per timing: one launch is too short to time well
            torch.mm(a, b)
        end_event.record()
        end_event.synchronize()
        best = min(best, start_event.elapsed_time(end_event) / 1000 / 5)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / best


def probe_cuda(device: torch.device, seconds: float) -> dict:
    with torch.cuda.device(device):  # events and the cache belong to the probed GPU
        flops = _time_cuda_matmul(device, seconds)
    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    try:
        gpu = find(props.name)
    except UserError:
        gpu = None
    peak = gpu.bf16_tflops * 1e12 if gpu else None
    return {
        "type": "cuda",
        "index": device.index,
        "name": props.name,
        "memory_gb": round(props.total_memory / 1e9, 2),
        "compute_capability": list(capability),
        "bf16": capability >= (8, 0),
        "fp8": capability >= FP8_MIN_CAPABILITY,
        "driver": driver_version(),
        "cuda_runtime": torch.version.cuda,
        "catalogue": gpu.key if gpu else None,
        "peak_bf16_flops": peak,
        "peak_fp8_flops": gpu.fp8_tflops * 1e12 if gpu and gpu.fp8_tflops else None,
        "matmul_flops": flops,
        "matmul_fraction": flops / peak if peak else None,
    }


def probe_cpu(seconds: float) -> dict:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        memory = None
    return {
        "type": "cpu",
        "name": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "memory_gb": round(memory, 2) if memory else None,
        "matmul_flops": measured_cpu_peak_flops(torch.float32, seconds=seconds),
    }


def probe(device: torch.device, *, all_visible: bool, seconds: float) -> dict:
    """This process's device(s): every visible GPU when alone, the rank's own under torchrun."""
    if device.type != "cuda":
        return {"count": 1, "devices": [probe_cpu(seconds)]}
    count = torch.cuda.device_count()
    targets = [torch.device("cuda", i) for i in range(count)] if all_visible else [device]
    return {"count": count, "devices": [probe_cuda(t, seconds) for t in targets]}
