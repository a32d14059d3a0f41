"""LoRA under bf16 holds the blocks' frozen linear layers in bf16: autocast reads them in bf16
anyway, so a training step computes exactly what it computed with them in float32."""

from __future__ import annotations

import torch

from hanlm.config import SftLoraSection
from hanlm.model import build_model, model_config
from hanlm.train import lora

SECTION = SftLoraSection(rank=4, target_modules=["q_proj", "v_proj", "down_proj"])
ROWS = (4, 5, 6, 7)


def _injected() -> torch.nn.Module:
    torch.manual_seed(0)
    config = model_config("tiny", vocab_size=512, seq_len=32)
    return lora.Adapters(SECTION, ROWS).inject(build_model(config), seed=1)[1]


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def test_bf16_frozen_linears_train_exactly_as_float32_ones_under_autocast():
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(2))
    as_float32, held = _injected(), _injected()
    stored = lora.hold_frozen_linears(held, torch.bfloat16)

    loss, grads = _step(as_float32, ids)
    held_loss, held_grads = _step(held, ids)
    assert torch.equal(held_loss, loss)
    assert held_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():
        assert held_grads[name].dtype == torch.float32, name
        assert torch.equal(held_grads[name], grad), name

    dtypes = {n: p.dtype for n, p in held.named_parameters()}
    low = {n for n, d in dtypes.items() if d == torch.bfloat16}
    assert low and all(".layers." in n and n.endswith(".weight") for n in low)
    assert all("lora_" not in n and "norm" not in n for n in low)
    assert all(dtypes[n] == torch.float32 for n in dtypes if "embed" in n or "lm_head" in n)
    assert all(not p.requires_grad for n, p in held.named_parameters() if n in low)
    assert stored == sum(p.numel() for n, p in held.named_parameters() if n in low)


def test_nothing_moves_at_float32():
    model = _injected()
    assert lora.hold_frozen_linears(model, torch.float32) == 0
    assert {p.dtype for p in model.parameters()} == {torch.float32}
