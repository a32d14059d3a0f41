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
import torch.distributed as torch_dist

from hanlm.train.parallel import Dist

OPERATIONS = ("all_reduce", "all_gather", "reduce_scatter")
PATTERN_PERIOD = 251  # payload values (i % 251 + 1) * (rank + 1): exact in float32 for any sum

# torch renamed the tensor forms; keep working on versions before and after
_all_gather = getattr(torch_dist, "all_gather_single", None) or torch_dist.all_gather_into_tensor
_reduce_scatter = (
    getattr(torch_dist, "reduce_scatter_single", None) or torch_dist.reduce_scatter_tensor
)


def bus_factor(operation: str, world_size: int) -> float:
    return (
        2 * (world_size - 1) / world_size
        if operation == "all_reduce"
        else (world_size - 1) / world_size
    )


def zeroed_ranks() -> set[int] | str:
    """HANLM_FAULT_COLLECTIVE_ZEROS: ranks ("1", "0,1" or "all") whose results become zeros."""
    spec = os.environ.get("HANLM_FAULT_COLLECTIVE_ZEROS", "").strip()
    if spec == "all":
        return "all"
    return {int(r) for r in spec.split(",") if r.strip()}


class _Buffers:
    """Inputs, outputs and expected results of the three operations for one rank."""

    def __init__(self, dist: Dist, count: int):
        world_size, rank = dist.world_size, dist.rank
        self.chunk = count // world_size
        base = torch.arange(count, device=dist.device, dtype=torch.float32) % PATTERN_PERIOD + 1
        rank_sum = world_size * (world_size + 1) / 2  # sum over ranks k of (k + 1)
        self.base, self.scale, self.rank_sum = base, rank + 1, rank_sum
        self.inputs = {
            "all_reduce": base * self.scale,
            "all_gather": base[: self.chunk] * self.scale,
            "reduce_scatter": base * self.scale,
        }
        self.outputs = {
            "all_reduce": self.inputs["all_reduce"].clone(),
            "all_gather": torch.empty(self.chunk * world_size, device=dist.device),
            "reduce_scatter": torch.empty(self.chunk, device=dist.device),
        }
        factors = torch.arange(1, world_size + 1, device=dist.device, dtype=torch.float32)
        self.expected = {
            "all_reduce": base * rank_sum,
            "all_gather": (factors[:, None] * base[: self.chunk][None, :]).reshape(-1),
            "reduce_scatter": base[rank * self.chunk : (rank + 1) * self.chunk] * rank_sum,
        }

    def run(self, operation: str) -> torch.Tensor:
        out = self.outputs[operation]
        if operation == "all_reduce":
            torch_dist.all_reduce(out)  # in place: the timed loop does not care that values grow
        elif operation == "all_gather":
            _all_gather(out, self.inputs["all_gather"])
        else:
            _reduce_scatter(out, self.inputs["reduce_scatter"])
        return out


def _synchronize(dist: Dist) -> None:
    if dist.device.type == "cuda":
        torch.cuda.synchronize(dist.device)


def measure(dist: Dist, *, size_mb: float, iters: int) -> dict:
    """Per operation: whether this rank got the right answer, and the slowest rank's timing."""
    world_size = dist.world_size
    # float32 elements, a multiple of world_size
    count = max(world_size, int(size_mb * 1e6) // 4 // world_size * world_size)
    buffers = _Buffers(dist, count)
    faulty = zeroed_ranks()
    results = {}
    for operation in OPERATIONS:
        if operation == "all_reduce":
            buffers.outputs[operation].copy_(buffers.inputs[operation])
        out = buffers.run(operation)  # also the warm-up
        _synchronize(dist)
        if faulty == "all" or dist.rank in faulty:
            out.zero_()  # what a broken peer-to-peer path returns
        correct = bool(torch.equal(out, buffers.expected[operation]))
        all_zero = bool(not out.any())

        torch_dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            buffers.run(operation)
        _synchronize(dist)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], device=dist.device)
        torch_dist.all_reduce(elapsed, op=torch_dist.ReduceOp.MAX)
        seconds = float(elapsed.item())
        # the size nccl-tests reports: the all-reduce buffer, the gathered / scattered whole
        nbytes = count * 4 if operation != "all_gather" else buffers.chunk * world_size * 4
        algbw = nbytes / seconds
        results[operation] = {
            "correct": correct,
            "all_zero": all_zero,
            "bytes": nbytes,
            "time_s": seconds,
            "algbw_gbs": algbw / 1e9,
            "busbw_gbs": algbw * bus_factor(operation, world_size) / 1e9,
        }
    return results
