"""Measure one training step's memory on fake tensors: what `hanlm plan` estimates, observed.

The model is built and run under `FakeTensorMode`, so no memory is allocated and no arithmetic
is done: a 1.3B model at sequence length 2,048 is traced on a laptop in seconds. PyTorch's
`MemTracker` (torch.distributed._tools) files every tensor alive at each moment under
parameters, gradients, optimizer states, activations and temporaries. The step is hanlm's:
forward under the precision's autocast ending in the chunked token-summed cross-entropy
(hanlm.train.loss), backward, fused AdamW. Single process: sharding divides the model state, which the planner
counts exactly, and leaves a rank's activations as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class MeasuredStep:
    """Bytes observed in one training step on fake tensors."""

    activations: int  # tensors the forward keeps for backward, the loss's gradients included
    peak: int  # everything alive at the step's peak
    peak_by_kind: dict[str, int]  # parameters, gradients, optimizer states, ... at that peak


def measure_step(
    config,
    *,
    seq_len: int,
    micro_batch: int,
    precision: str,
    recompute: str,
    bf16_params: bool = False,
    loss_chunk_tokens: int = 1024,
) -> MeasuredStep:
    """Trace one optimizer step of `config` on fake tensors and report its memory.

    bf16_params builds the model in bf16, as FSDP2's mixed precision gathers it for compute.
    """
    # deferred: torch's private tracing modules, loaded only when a step is traced
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from hanlm.model import build_model, enable_activation_checkpointing  # deferred: transformers
    from hanlm.train.loss import CausalLMWithLoss, TokenLoss

    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    autocast = precision in ("bf16", "fp8")
    with FakeTensorMode():
        model = build_model(config, dtype=torch.bfloat16 if bf16_params else torch.float32)
        if recompute != "none":
            enable_activation_checkpointing(model, recompute)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        ids = torch.zeros(micro_batch, seq_len, dtype=torch.long)
        root = CausalLMWithLoss(model)
        loss_fn = TokenLoss(loss_chunk_tokens).sums
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = root(labels=ids, loss_fn=loss_fn, input_ids=ids)["loss"]
            after_forward = tracker.get_tracker_snapshot()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peak = tracker.get_tracker_snapshot("peak")
    forward = _one_device(after_forward)
    at_peak = _one_device(peak)
    return MeasuredStep(
        activations=forward.get("Activation", 0),
        peak=at_peak.get("Total", 0),
        peak_by_kind={k: v for k, v in at_peak.items() if k != "Total"},
    )


def _one_device(snapshot: dict) -> dict[str, int]:
    (by_kind,) = snapshot.values()  # the trace runs on one device
    return {getattr(k, "value", str(k)): int(v) for k, v in by_kind.items()}
