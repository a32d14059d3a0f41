"""The training loss from the final hidden states and the output head, a chunk of tokens at a time.

The logits of a whole micro-batch are never made: at vocabulary 65,536, sequence 2,048 and
micro-batch 8 they are 2 GiB in bf16, 4 GiB more upcast to float32, and as much again for the
log-softmax and each gradient. Here each chunk of `chunk_tokens` tokens gets its logits
(in the compute dtype), upcast to float32, its loss summed, and its gradients with respect to
the hidden states and the head's weight computed at once, in the forward (the "fused linear +
cross-entropy" pattern): one chunk's logits exist at a time, and the forward keeps only those two
gradients, which backward scales. The matmuls are those of the plain path (the logits and their
two gradients), none is run twice.

The loss of a chunk is an `Objective`: token-summed cross-entropy by default; distillation
passes its own (hanlm.train.distill). Validation takes per-token losses, without gradients.

`CausalLMWithLoss` runs the decoder and the loss in one forward. It is the module DDP and FSDP2
wrap (hanlm.train.parallel): the head's weight, tied to the embedding, belongs to FSDP2's root
group, which is gathered only inside the root's forward; a loss computed after the forward from
`model.lm_head.weight` would read a sharded or stale tensor and bypass the root's hooks.

On CUDA, kernel "liger" computes the plain cross-entropy with Liger-Kernel's fused linear
cross-entropy when it is installed (it is not a dependency); the chunked path runs everywhere.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hanlm.errors import UserError

IGNORE = -100
DEFAULT_CHUNK_TOKENS = 1024
KERNELS = ("chunked", "auto", "liger")
CHUNK_KEY = "parallel.loss_chunk_tokens"
KERNEL_KEY = "parallel.loss_kernel"

# (float32 logits of a chunk [tokens, vocab], its labels [tokens], its rows among the micro-batch's
# tokens) -> sums over the chunk's tokens: "loss" (differentiable) and any parts to log.
Objective = Callable[[torch.Tensor, torch.Tensor, slice], dict[str, torch.Tensor]]


def cross_entropy_sums(logits: torch.Tensor, labels: torch.Tensor, rows: slice) -> dict:
    """Token-summed cross-entropy of one chunk; ignored labels add nothing."""
    return {"loss": F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")}


def check_chunk_tokens(chunk_tokens) -> int:
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise UserError(
            f"the loss chunk size must be a whole number of tokens >= 1, got {chunk_tokens!r}",
            where=CHUNK_KEY,
            fix=f"set {CHUNK_KEY} to e.g. {DEFAULT_CHUNK_TOKENS}",
        )
    return chunk_tokens


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def resolve_kernel(kernel: str, device: torch.device | str) -> str:
    """`chunked` or `liger` for `kernel` on `device` (auto: Liger on CUDA when installed)."""
    on_cuda = torch.device(device).type == "cuda"
    if kernel == "chunked":
        return "chunked"
    if kernel == "auto":
        return "liger" if on_cuda and liger_available() else "chunked"
    if kernel == "liger":
        if not on_cuda:
            raise UserError(
                f"Liger-Kernel's fused linear cross-entropy runs on CUDA only, not on "
                f"{torch.device(device).type}",
                where=KERNEL_KEY,
                fix=f'set {KERNEL_KEY} = "chunked" (or "auto": Liger where it can run)',
            )
        if not liger_available():
            raise UserError(
                "Liger-Kernel is not installed",
                where=KERNEL_KEY,
                fix=f'pip install liger-kernel, or set {KERNEL_KEY} = "chunked"',
            )
        return "liger"
    raise UserError(
        f"unknown loss kernel {kernel!r}", where=KERNEL_KEY, fix=f"use one of {', '.join(KERNELS)}"
    )


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output head's matmul would run in here: autocast's, else the inputs'."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


class _PrecomputedGrad(torch.autograd.Function):
    """A scalar whose gradients with respect to `hidden` and `weight` were computed with it:
    backward only scales them by the incoming gradient, in place (no second copy of the head's
    gradient at the start of backward, when memory peaks), so it runs once."""

    @staticmethod
    def forward(ctx, value, hidden, weight, grad_hidden, grad_weight):
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.done = False
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.done:
            raise RuntimeError("the chunked loss's backward runs once: its gradients are consumed")
        ctx.done = True
        grad_hidden, grad_weight = ctx.saved_tensors
        to_hidden = grad_hidden.mul_(grad) if ctx.needs_input_grad[1] else None
        to_weight = grad_weight.mul_(grad) if ctx.needs_input_grad[2] else None
        return None, to_hidden, to_weight, None, None


def chunked_loss_sums(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    objective: Objective = cross_entropy_sums,
) -> dict[str, torch.Tensor]:
    """The objective's sums over all tokens of `hidden` [..., H] under the head `weight` [V, H],
    computed `chunk_tokens` tokens at a time. "loss" carries gradients to `hidden` and `weight`
    (when they need them and grad mode is on); the other parts are detached."""
    check_chunk_tokens(chunk_tokens)
    flat = hidden.reshape(-1, hidden.size(-1))
    flat_labels = labels.reshape(-1)
    grad_on = torch.is_grad_enabled()
    want_hidden = grad_on and flat.requires_grad
    want_weight = grad_on and weight.requires_grad
    dtype = _compute_dtype(flat, weight)
    n = flat.size(0)
    sums: dict[str, torch.Tensor] = {}
    grad_hidden = torch.empty_like(flat) if want_hidden else None
    # summed over chunks in float32 whatever the weight's dtype: no rounding per chunk
    grad_weight = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        if want_weight
        else None
    )
    # explicit dtypes instead of autocast: autocast would cache a cast of the weight per chunk
    with torch.autocast(flat.device.type, enabled=False):
        w = weight.detach().to(dtype).requires_grad_(want_weight)
        for start in range(0, n, chunk_tokens) if n else [0]:
            rows = slice(start, min(start + chunk_tokens, n))
            h = flat[rows].detach().to(dtype).requires_grad_(want_hidden)
            with torch.set_grad_enabled(want_hidden or want_weight):
                chunk = objective(F.linear(h, w).float(), flat_labels[rows], rows)
                wrt = [t for t, wanted in ((h, want_hidden), (w, want_weight)) if wanted]
                grads = list(torch.autograd.grad(chunk["loss"], wrt)) if wrt else []
            if want_hidden:
                grad_hidden[rows] = grads.pop(0)
            if want_weight:
                grad_weight += grads.pop(0)
            for name, value in chunk.items():
                value = value.detach().float()
                sums[name] = sums[name] + value if name in sums else value
    if want_hidden or want_weight:
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        sums["loss"] = _PrecomputedGrad.apply(sums["loss"], flat, weight, grad_hidden, grad_weight)
    return sums


@torch.no_grad()
def chunked_token_losses(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Float32 cross-entropy of each token of `hidden` [..., H] (0 where the label is ignored),
    flattened; for validation: no gradients."""
    check_chunk_tokens(chunk_tokens)
    flat = hidden.reshape(-1, hidden.size(-1))
    flat_labels = labels.reshape(-1)
    dtype = _compute_dtype(flat, weight)
    out = torch.empty(flat.size(0), dtype=torch.float32, device=flat.device)
    with torch.autocast(flat.device.type, enabled=False):
        w = weight.to(dtype)
        for start in range(0, flat.size(0), chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            logits = F.linear(flat[rows].to(dtype), w).float()
            out[rows] = F.cross_entropy(
                logits, flat_labels[rows], ignore_index=IGNORE, reduction="none"
            )
    return out


def liger_loss_sums(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Token-summed cross-entropy by Liger-Kernel's fused linear cross-entropy (CUDA)."""
    # deferred: optional, CUDA-only (Triton kernels)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    flat = hidden.reshape(-1, hidden.size(-1))
    dtype = _compute_dtype(flat, weight)
    with torch.autocast(flat.device.type, enabled=False):
        loss = liger_fused_linear_cross_entropy(
            flat.to(dtype),
            weight.to(dtype),
            labels.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
    if isinstance(loss, tuple):  # versions that return (loss, z_loss)
        loss = loss[0]
    return {"loss": loss.float()}


@dataclass(frozen=True)
class TokenLoss:
    """How a micro-batch's loss is computed from the decoder's output: chunked (any device) or
    by Liger's kernel ("liger", CUDA, plain cross-entropy only)."""

    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    kernel: str = "chunked"

    def __post_init__(self) -> None:
        check_chunk_tokens(self.chunk_tokens)
        if self.kernel not in ("chunked", "liger"):
            raise ValueError(f"kernel must be chunked or liger (resolved), not {self.kernel!r}")

    @classmethod
    def from_settings(cls, chunk_tokens: int, kernel: str, device) -> TokenLoss:
        return cls(check_chunk_tokens(chunk_tokens), resolve_kernel(kernel, device))

    def sums(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        objective: Objective | None = None,
    ) -> dict[str, torch.Tensor]:
        if objective is None and self.kernel == "liger" and torch.is_grad_enabled():
            return liger_loss_sums(hidden, weight, labels)
        return chunked_loss_sums(
            hidden,
            weight,
            labels,
            chunk_tokens=self.chunk_tokens,
            objective=objective or cross_entropy_sums,
        )

    def token_losses(
        self, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return chunked_token_losses(hidden, weight, labels, chunk_tokens=self.chunk_tokens)


# (final hidden states [B, T, H], the output head's weight [V, H], labels [B, T]) -> the loss
HeadLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]


# Config keys of models whose forward changes the logits after the output head (Gemma 2's
# soft-capping, Cohere's and Granite's scales): the loss from the head's weight alone would differ.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def check_plain_head(model: torch.nn.Module, what: str = "the model") -> None:
    """A UserError unless `model`'s logits are its final hidden states times the head's weight."""
    config = model.config.get_text_config()
    for key in _LOGIT_TRANSFORMS:
        value = getattr(config, key, None)
        if value not in (None, 1, 1.0):
            raise UserError(
                f"{what} ({type(model).__name__}) transforms its logits after the output head "
                f"({key} = {value}); hanlm's loss computes them from the head's weight",
                fix="train or distil from a Llama-family model (hanlm's presets are)",
            )


class CausalLMWithLoss(torch.nn.Module):
    """A causal LM whose forward ends in a loss computed from its final hidden states: the
    decoder runs as in the model's own forward, then `loss_fn(hidden, head weight, labels)`
    instead of the output head. `module` is the causal LM (checkpoints and export use it)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        check_plain_head(model)
        self.module = model

    def forward(self, *, labels: torch.Tensor, loss_fn: HeadLoss, **model_inputs):
        decoder = self.module.get_decoder()
        # No KV cache in training: building one also makes dynamo guard each compiled block on
        # its own cache layer, so per-block compile recompiled once per layer and hit its limit.
        hidden = decoder(**model_inputs, use_cache=False).last_hidden_state
        head = self.module.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError(f"{type(self.module).__name__}: an output head with a bias")
        return loss_fn(hidden, head.weight, labels)


def with_loss(model: torch.nn.Module) -> torch.nn.Module:
    """`model` ending in CausalLMWithLoss: as it is when it does (hanlm.train.parallel wraps it
    before DDP or FSDP2), wrapped when it is a plain single-process model."""
    from torch.distributed.fsdp import FSDPModule  # deferred: as in hanlm.train.parallel

    inner = getattr(model, "module", model)  # DDP's
    if isinstance(model, CausalLMWithLoss) or isinstance(inner, CausalLMWithLoss):
        return model
    if inner is not model or isinstance(model, FSDPModule):  # its hooks would be bypassed
        raise ValueError(
            "wrap the model with CausalLMWithLoss before DDP/FSDP (hanlm.train.parallel.parallelize)"
        )
    return CausalLMWithLoss(model)
