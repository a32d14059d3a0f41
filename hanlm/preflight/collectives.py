"""All-reduce, all-gather and reduce-scatter across every rank: verified, then timed.

Each rank sends a deterministic payload that depends on its rank (small integers in float32, so
every sum is exact), and checks what came back against the exact answer: a consumer-GPU
peer-to-peer bug can return zeros or stale data while NCCL reports success. Bandwidth follows
nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, where bytes is the all-reduce buffer, the
gathered output or the scattered input; busbw = algbw x 2(n-1)/n for all-reduce and x (n-1)/n
for all-gather and reduce-scatter, the per-rank link rate a ring needs for that time.
The time of an operation is the slowest rank's.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from hanlm.train.parallel import Dist

OPERATIONS = ("all_reduce", "all_gather", "reduce_scatter")
PATTERN_PERIOD = 251  # payload values (i % 251 + 1) * (rank + 1): exact in float32 for any sum

# torch renamed the tensor forms; keep working on versions before and after
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def bus_factor(operation: str, n: int) -> float:
    return 2 * (n - 1) / n if operation == "all_reduce" else (n - 1) / n


def zeroed_ranks() -> set[int] | str:
    """HANLM_FAULT_COLLECTIVE_ZEROS: ranks ("1", "0,1" or "all") whose results become zeros."""
    spec = os.environ.get("HANLM_FAULT_COLLECTIVE_ZEROS", "").strip()
    if spec == "all":
        return "all"
    return {int(r) for r in spec.split(",") if r.strip()}


class _Buffers:
    """Inputs, outputs and expected results of the three operations for one rank."""

    def __init__(self, d: Dist, count: int):
        n, r = d.world_size, d.rank
        self.chunk = count // n
        base = torch.arange(count, device=d.device, dtype=torch.float32) % PATTERN_PERIOD + 1
        rank_sum = n * (n + 1) / 2  # sum over ranks k of (k + 1)
        self.base, self.scale, self.rank_sum = base, r + 1, rank_sum
        self.inputs = {
            "all_reduce": base * self.scale,
            "all_gather": base[: self.chunk] * self.scale,
            "reduce_scatter": base * self.scale,
        }
        self.outputs = {
            "all_reduce": self.inputs["all_reduce"].clone(),
            "all_gather": torch.empty(self.chunk * n, device=d.device),
            "reduce_scatter": torch.empty(self.chunk, device=d.device),
        }
        factors = torch.arange(1, n + 1, device=d.device, dtype=torch.float32)
        self.expected = {
            "all_reduce": base * rank_sum,
            "all_gather": (factors[:, None] * base[: self.chunk][None, :]).reshape(-1),
            "reduce_scatter": base[r * self.chunk : (r + 1) * self.chunk] * rank_sum,
        }

    def run(self, operation: str) -> torch.Tensor:
        out = self.outputs[operation]
        if operation == "all_reduce":
            dist.all_reduce(out)  # in place: the timed loop does not care that values grow
        elif operation == "all_gather":
            _all_gather(out, self.inputs["all_gather"])
        else:
            _reduce_scatter(out, self.inputs["reduce_scatter"])
        return out


def _synchronize(d: Dist) -> None:
    if d.device.type == "cuda":
        torch.cuda.synchronize(d.device)


def measure(d: Dist, *, size_mb: float, iters: int) -> dict:
    """Per operation: whether this rank got the right answer, and the slowest rank's timing."""
    n = d.world_size
    count = max(n, int(size_mb * 1e6) // 4 // n * n)  # float32 elements, a multiple of n
    buffers = _Buffers(d, count)
    faulty = zeroed_ranks()
    results = {}
    for operation in OPERATIONS:
        if operation == "all_reduce":
            buffers.outputs[operation].copy_(buffers.inputs[operation])
        out = buffers.run(operation)  # also the warm-up
        _synchronize(d)
        if faulty == "all" or d.rank in faulty:
            out.zero_()  # what a broken peer-to-peer path returns
        correct = bool(torch.equal(out, buffers.expected[operation]))
        all_zero = bool(not out.any())

        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            buffers.run(operation)
        _synchronize(d)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], device=d.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(elapsed.item())
        # the size nccl-tests reports: the all-reduce buffer, the gathered / scattered whole
        nbytes = count * 4 if operation != "all_gather" else buffers.chunk * n * 4
        algbw = nbytes / seconds
        results[operation] = {
            "correct": correct,
            "all_zero": all_zero,
            "bytes": nbytes,
            "time_s": seconds,
            "algbw_gbs": algbw / 1e9,
            "busbw_gbs": algbw * bus_factor(operation, n) / 1e9,
        }
    return results
