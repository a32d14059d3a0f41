"""Muon for the decoder blocks' matrices, AdamW for everything else, stepped as one optimizer.

Which parameter goes where: Muon takes the 2-D weights inside the decoder blocks (the attention
and MLP projections); AdamW takes the token embedding, the output head, the norms and any biases
(Muon orthogonalises hidden-layer updates; an embedding row or a logit row is not a hidden map:
Jordan et al. 2024, nanochat, Moonlight). `split` decides it and `describe` says it at start.

Muon's update is `torch.optim.Muon`'s: the momentum buffer `B <- mu B + (1 - mu) g` (a lerp),
the Nesterov update `g + mu (B - g)`, five quintic Newton-Schulz steps with the same
coefficients, decoupled weight decay `W <- W (1 - lr wd)` and the step `W <- W - lr' O` with
`lr' = adjust(lr, shape)`: `original` sqrt(max(1, rows/cols)) (Keller Jordan's), or
`match_rms_adamw` 0.2 sqrt(max(rows, cols)) (Moonlight's, which lets Muon reuse AdamW's learning
rate and weight decay). One departure, the Newton-Schulz dtype: bfloat16 on a GPU as torch's,
float32 on a CPU, where bfloat16 matmuls run up to 75x slower than float32 (this machine).

Under FSDP2 a rank holds row shards of each matrix, and Newton-Schulz needs the whole matrix:
the momentum-corrected update is all-gathered (`DTensor.full_tensor`), orthogonalised on every
rank, and each rank keeps its own rows. The momentum buffer stays sharded like its weight.
(Every rank repeating Newton-Schulz costs a few percent of a step at 1.3b; torchtitan's and
Dion's distributed Muon hand whole matrices to ranks in turn instead, for a broadcast.)

The two halves are real optimizers (torch's AdamW, and Muon below, a `torch.optim.Muon`), so
that DCP saves and reshards their state as it does AdamW's alone (`get_state_dict` takes several
optimizers); `MuonAdamW` steps both and shows their groups as one list, each group's `lr_scale`
its learning rate over the schedule's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.distributed.tensor import distribute_tensor

ADJUST_LR = ("original", "match_rms_adamw")
# torch.optim.Muon's quintic coefficients and its norm floor (torch/optim/_muon.py), whose
# module is private: test_muon checks the step against torch.optim.Muon's
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7


def adjusted_lr(lr: float, rule: str, shape: torch.Size) -> float:
    rows, cols = shape[:2]
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1.0, rows / cols))


def newton_schulz(update: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """The quintic Newton-Schulz orthogonalisation of torch.optim.Muon, in `dtype`."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(dtype)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=EPS)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def _own_rows(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` as a DTensor placed as `like` (each rank keeps its own part; nothing is sent)."""
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


class Muon(torch.optim.Muon):
    """torch.optim.Muon with Newton-Schulz in a chosen dtype and FSDP2's row-sharded weights."""

    def __init__(self, params, *, ns_dtype: torch.dtype, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(param.grad, 1 - mu)
                update = param.grad.lerp(buf, mu) if group["nesterov"] else buf
                whole = update.full_tensor() if _is_dtensor(update) else update
                ortho = newton_schulz(whole, group["ns_steps"], self.ns_dtype)
                ortho = ortho.to(param.dtype)
                if _is_dtensor(param):
                    ortho = _own_rows(ortho, param)
                param.mul_(1 - lr * wd)
                param.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss


@dataclass(frozen=True)
class Split:
    """The model's trainable parameters by optimizer: names, and counts of elements."""

    muon: list[tuple[str, torch.nn.Parameter]]
    adamw: list[tuple[str, torch.nn.Parameter]]

    def describe(self, muon_lr: float, adamw_lr: float) -> str:
        muon_n = sum(p.numel() for _, p in self.muon)
        adamw_n = sum(p.numel() for _, p in self.adamw)
        kinds = sorted({_kind(name) for name, _ in self.adamw})
        return (
            f"optimizer: Muon on the blocks' {len(self.muon)} matrices ({muon_n:,} parameters, "
            f"lr {muon_lr:g}); AdamW on {', '.join(kinds)} ({len(self.adamw)} tensors, "
            f"{adamw_n:,} parameters, lr {adamw_lr:g})"
        )


def _kind(name: str) -> str:
    if "embed" in name:
        return "the embedding"
    if "lm_head" in name or "output" in name:
        return "the output head"
    if "norm" in name:
        return "norms"
    if name.endswith("bias"):
        return "biases"
    return name.rsplit(".", 2)[-2] if "." in name else name


def split(model: torch.nn.Module, blocks: list[torch.nn.Module]) -> Split:
    """Muon: the 2-D weights of `blocks` (the decoder layers); AdamW: every other trainable
    parameter."""
    in_blocks = {id(p) for block in blocks for p in block.parameters() if p.ndim == 2}
    muon, adamw = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (muon if id(param) in in_blocks else adamw).append((name, param))
    return Split(muon, adamw)


class MuonAdamW:
    """AdamW and Muon stepped together: what the Trainer and DCP need of one optimizer."""

    def __init__(self, adamw: torch.optim.Optimizer, muon: Muon) -> None:
        self.adamw, self.muon = adamw, muon

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:  # DCP's get/set_state_dict
        return iter((self.adamw, self.muon))

    @property
    def param_groups(self) -> list[dict]:
        return [*self.adamw.param_groups, *self.muon.param_groups]

    @property
    def state(self) -> dict:
        return {**self.adamw.state, **self.muon.state}

    def step(self, closure=None):
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    # the token matrices are AdamW's: SFT's row step scale hooks there
    def register_step_pre_hook(self, hook):
        return self.adamw.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        return self.adamw.register_step_post_hook(hook)
