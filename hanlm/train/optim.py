"""AdamW with the usual parameter groups, and the learning-rate schedules as pure functions."""

from __future__ import annotations

import math

import torch


def param_groups(params, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (linear and embedding weights), never on norms and biases."""
    decay, no_decay = [], []
    for param in params:
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def adamw(
    model: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple, eps: float, device
) -> torch.optim.AdamW:
    """AdamW over every trainable parameter of the model."""
    return adamw_over(
        list(model.parameters()), lr=lr, weight_decay=weight_decay, betas=betas, eps=eps
    )


def adamw_over(
    params: list, *, lr: float, weight_decay: float, betas: tuple, eps: float
) -> torch.optim.AdamW:
    """Fused AdamW where the device has the kernel (CUDA, and CPU in recent torch)."""
    groups = param_groups(params, weight_decay)
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_at(
    step: int,
    *,
    total_steps: int,
    peak: float,
    warmup_steps: int,
    min_ratio: float,
    schedule: str,
    decay_fraction: float = 0.2,
) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine or WSD."""
    floor = peak * min_ratio
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    # warm-up-stable-decay: flat at the peak, then a linear decay over the last steps
    decay_steps = max(1, round(total_steps * decay_fraction))
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return peak
    progress = min(1.0, (step - decay_start + 1) / decay_steps)
    return peak + (floor - peak) * progress
