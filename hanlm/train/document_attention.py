"""Attention that stays within each packed document: the model inputs that make it so.

The loaders give a batch of packed rows per-document `position_ids` (hanlm.data.packing). Here
they become the keyword inputs of the model call: the same `position_ids` (rotary positions as
if each document were alone) and an explicit attention mask that lets a token see only the
earlier tokens of its own document, in the form the model's attention implementation takes:

- `flex_attention`: a `BlockMask` (causal and same-document). Blocks that cross documents are
  skipped, and nothing of size seq_len² is kept. Chosen on CUDA (`parallel.document_attention =
  "auto"`), where flex attention runs as a generated Triton kernel.
- `sdpa`, the portable path (CPU, and CUDA with `document_attention = "sdpa"`): a boolean
  `(batch, 1, seq_len, seq_len)` mask, block-diagonal and causal. PyTorch's SDPA then runs its
  memory-efficient or math kernel (its flash kernel takes no mask).
- `eager` (a model without SDPA): the same mask as additive float.

Why not let transformers infer the packing from `position_ids` alone: it does so only without a
KV cache (the model builds one in training whenever config.use_cache is true, and the mask is
then silently plain causal), only in recent versions, and for flash-attention's varlen kernel
only at batch size 1. An explicit 4D mask is used as it is by every version that accepts one.
Flash-attention 2/3 are not offered: hanlm builds its models with SDPA.

A model whose layers are not all full attention (sliding windows, linear or state-space layers)
cannot keep documents apart this way and is refused with the setting to change.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hanlm.console import warn
from hanlm.errors import UserError
from hanlm.train import parallel

CHOICES = ("auto", "sdpa", "flex")
MASKED = ("sdpa", "eager", "flex_attention")  # implementations this module gives a mask


def _flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401
    except ImportError:
        return False
    return True


def _refuse(what: str, setting: str) -> UserError:
    return UserError(
        what,
        where=setting,
        fix=f"set {setting} = false (documents then see each other, as before), or use a model "
        "whose layers are all full attention (the hanlm presets are)",
    )


def _check_full_attention(config, setting: str) -> None:
    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        others = sorted({t for t in layer_types if t != "full_attention"})
        if others:
            raise _refuse(
                f"the model has {', '.join(others)} layers; only full-attention layers can keep "
                "packed documents apart",
                setting,
            )
    elif not getattr(text, "num_attention_heads", None):
        raise _refuse("the model has no attention layers to keep packed documents apart", setting)
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        raise _refuse(
            f"the model attends through a sliding window ({text.sliding_window} tokens), which "
            "an explicit document mask would replace",
            setting,
        )


def prepare(
    model: torch.nn.Module, device: torch.device, choice: str = "auto", *, setting: str
) -> str:
    """Check that `model` can keep packed documents apart and give it the attention
    implementation for `choice` (parallel.document_attention) on `device`; returns its name.

    Call it before the model is wrapped or compiled. `setting` names the key that asked for
    document masking, for the error message.
    """
    if choice not in CHOICES:
        raise UserError(
            f"parallel.document_attention {choice!r} is not one of {', '.join(CHOICES)}",
            fix='use "auto", "sdpa" or "flex"',
        )
    model = parallel.unwrap(model)
    _check_full_attention(model.config, setting)
    flex_ok = getattr(model, "_supports_flex_attn", False) and _flex_available()
    if choice == "flex" and not flex_ok:
        raise UserError(
            f"flex attention is not available for {type(model).__name__} with torch "
            f"{torch.__version__}",
            where="parallel.document_attention",
            fix='set parallel.document_attention = "sdpa" (or "auto")',
        )
    if choice == "flex" and device.type == "cpu":
        warn(
            "flex attention on CPU runs torch's compiled CPU kernel, which gave wrong results "
            "even for plain causal attention on an AVX2 AMD EPYC with torch 2.13: prefer "
            'parallel.document_attention = "sdpa" (what "auto" chooses) on CPU'
        )
    current = model.config._attn_implementation
    if choice == "flex" or (choice == "auto" and device.type == "cuda" and flex_ok):
        wanted = "flex_attention"
    elif getattr(model, "_supports_sdpa", False):
        wanted = "sdpa"
    elif current == "eager":
        wanted = "eager"
    else:
        raise _refuse(
            f"{type(model).__name__} supports neither SDPA nor flex attention, so packed "
            "documents cannot be masked apart",
            setting,
        )
    if wanted != current:
        model.set_attn_implementation(wanted)
    return wanted


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Each token's document within its row: a new one starts wherever the position is 0."""
    return (position_ids == 0).cumsum(dim=-1)


def _allowed(documents: torch.Tensor) -> torch.Tensor:
    """(batch, 1, L, L) booleans: query i may see key j (same document, j <= i)."""
    length = documents.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=documents.device).tril()
    return ((documents[:, :, None] == documents[:, None, :]) & causal)[:, None]


def _block_mask(documents: torch.Tensor):
    # deferred: flex attention is only used on CUDA, where its import compiles Triton helpers
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(batch, head, q, kv):
        return (documents[batch, q] == documents[batch, kv]) & (q >= kv)

    batch, length = documents.shape
    return create_block_mask(
        same_document_causal, batch, None, length, length, device=documents.device
    )


def attention_mask(implementation: str, position_ids: torch.Tensor):
    """The attention mask of rows with per-document `position_ids` for `implementation`."""
    documents = document_ids(position_ids)
    if implementation == "flex_attention":
        return _block_mask(documents)
    allowed = _allowed(documents)
    if implementation == "sdpa":
        return allowed
    if implementation == "eager":
        blocked = torch.finfo(torch.float32).min
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, blocked)
    raise ValueError(
        f"attention implementation {implementation!r} is not one of {MASKED}: call "
        "document_attention.prepare on the model first"
    )


def model_inputs(
    model: torch.nn.Module, extra: Mapping[str, torch.Tensor] | None
) -> dict[str, object]:
    """The keyword inputs of `model`'s call for a batch's extra inputs (from its loader):
    nothing for plain rows, else position_ids and the document mask."""
    if not extra:
        return {}
    position_ids = extra["position_ids"]
    implementation = parallel.unwrap(model).config._attn_implementation
    return {
        "position_ids": position_ids,
        "attention_mask": attention_mask(implementation, position_ids),
    }
