"""Where a model runs and in what precision: one rule for every command that runs a model.

A device is named `auto` (the GPU when CUDA sees one, else the CPU), `cpu`, `cuda` or `cuda:N`
(any other name torch knows, such as `mps`, is taken as torch takes it). A CUDA device needs a
visible GPU, and `cuda:N` one of that index. Under torchrun a process passes its `local_rank`, and
a `cuda` without an index is then that process's own GPU.

A dtype is `auto` (what the folder's config.json says, as transformers loads by default), `fp32`
or `bf16`.
"""

from __future__ import annotations

import torch

from hanlm.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTO = "auto"


def resolve_device(
    name: str | torch.device, *, setting: str = "device", local_rank: int | None = None
) -> torch.device:
    """The torch device `name` stands for; `setting` (the config key) names it in errors."""
    if isinstance(name, torch.device):
        return name
    wanted = name
    if name == AUTO:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {wanted!r}", fix=f"use {DEVICE_CHOICES}") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise UserError(
            f"{setting} is {wanted} but no CUDA GPU is visible",
            fix=f"set --set {setting}=cpu, or check the driver with nvidia-smi",
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UserError(
            f"{setting} is {wanted} but only {count} CUDA GPU(s) are visible",
            fix=f"use cuda or cuda:0 to cuda:{count - 1}",
        )
    if device.index is None and local_rank is not None:
        device = torch.device("cuda", local_rank % count)
    return device


def resolve_dtype(name: str) -> torch.dtype | None:
    """The dtype to load weights in; None for `auto` (the folder's own)."""
    if name == AUTO:
        return None
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}", fix=f"use one of {', '.join(DTYPES)}")
    return DTYPES[name]
