"""hanlm.train.muon: Muon on exactly the decoder blocks' matrices, AdamW on the rest; one step
equals torch.optim.Muon's and torch.optim.AdamW's; the settings that cannot work are refused."""

from __future__ import annotations

import copy

import pytest
import torch

from hanlm.config import OptimizerSection, load_config
from hanlm.errors import UserError
from hanlm.model import build_model, model_config
from hanlm.train import muon, parallel
from hanlm.train.build import build_optimizer


def tiny(seed: int = 0, tied: bool = True):
    config = model_config("tiny", vocab_size=128, seq_len=32)
    config.tie_word_embeddings = tied
    return build_model(config, seed=seed)


def _step(model, optimizer, seed: int = 1):
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("tied", [True, False])
def test_exactly_the_blocks_matrices_get_muon(tied):
    model = tiny(tied=tied)
    parts = muon.split(model, parallel.decoder_layers(model))
    names = {n for n, _ in parts.muon}
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert names == {
        f"model.layers.{i}.{'self_attn' if p.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{p}.weight"
        for i in range(2) for p in projections
    }  # fmt: skip
    rest = {n for n, _ in parts.adamw}
    assert "model.embed_tokens.weight" in rest and "model.norm.weight" in rest
    assert ("lm_head.weight" in rest) is not tied  # a tied head is the embedding itself
    assert all(p.ndim == 1 for n, p in parts.adamw if "norm" in n)
    assert not names & rest
    line = parts.describe(0.02, 0.001)
    assert "Muon on the blocks' 14 matrices" in line and "the embedding" in line and "norms" in line


def test_one_step_equals_torch_muon_and_adamw():
    model = tiny(tied=False)
    reference = copy.deepcopy(model)
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5,
                    adjust_lr_fn="match_rms_adamw")  # fmt: skip
    parts = muon.split(model, parallel.decoder_layers(model))
    ours = muon.MuonAdamW(
        torch.optim.AdamW([p for _, p in parts.adamw], lr=1e-3, weight_decay=0.1),
        muon.Muon([p for _, p in parts.muon], ns_dtype=torch.bfloat16, **settings),
    )
    theirs_parts = muon.split(reference, parallel.decoder_layers(reference))
    theirs = [
        torch.optim.AdamW([p for _, p in theirs_parts.adamw], lr=1e-3, weight_decay=0.1),
        torch.optim.Muon([p for _, p in theirs_parts.muon], **settings),
    ]
    for step in range(3):
        _step(model, ours, seed=step)
        ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(step))
        reference(input_ids=ids, labels=ids).loss.backward()
        for optimizer in theirs:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for (name, mine), theirs_param in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        torch.testing.assert_close(mine, theirs_param, rtol=0, atol=0, msg=name)


def test_newton_schulz_in_float32_is_near_bfloat16_and_orthogonal():
    g = torch.randn(48, 96, generator=torch.Generator().manual_seed(0))
    fp32 = muon.newton_schulz(g, 5, torch.float32)
    bf16 = muon.newton_schulz(g, 5, torch.bfloat16).float()
    assert (fp32 - bf16).abs().max() < 0.05
    # singular values near one (the quintic's S' ~ U(0.5, 1.5)), whatever g's scale
    singular = torch.linalg.svdvals(fp32)
    assert singular.min() > 0.4 and singular.max() < 1.6
    assert torch.allclose(muon.newton_schulz(100 * g, 5, torch.float32), fp32, atol=1e-4)


def test_the_builder_gives_muon_its_own_rate_and_decay_and_adamw_the_rest():
    model = tiny()
    section = OptimizerSection(name="muon", lr=1e-3, weight_decay=0.1, muon_lr=0.02,
                               muon_weight_decay=0.0)  # fmt: skip
    optimizer = build_optimizer(section, model, "cpu")
    assert isinstance(optimizer, muon.MuonAdamW)
    adamw_groups, muon_groups = optimizer.adamw.param_groups, optimizer.muon.param_groups
    assert [g["weight_decay"] for g in adamw_groups] == [0.1, 0.0]  # never on norms
    assert muon_groups[0]["lr"] == 0.02 and muon_groups[0]["weight_decay"] == 0.0
    assert muon_groups[0]["lr_scale"] == pytest.approx(20.0)  # the schedule scales both alike
    assert optimizer.muon.ns_dtype == torch.float32  # on a CPU
    assert len(optimizer.param_groups) == 3
    _step(model, optimizer)
    assert {len(s) for s in optimizer.muon.state.values()} == {1}  # one buffer, not AdamW's two
    plain = build_optimizer(OptimizerSection(), tiny(), "cpu")
    assert isinstance(plain, torch.optim.AdamW)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"optimizer.name": "lion"}, "optimizer.name"),
        ({"optimizer.lr": -1e-3}, "optimizer.lr"),
        ({"optimizer.muon_lr": 0}, "optimizer.muon_lr"),
        ({"optimizer.muon_adjust_lr": "sqrt"}, "muon_adjust_lr"),
        ({"sft.optimizer.name": "muon", "sft.method": "lora"}, "LoRA"),
        # a compared LoRA variant too: never trained with another optimizer than asked
        ({"sft.optimizer.name": "muon", "sft.compare": [{"method": "lora"}]}, "sft.compare"),
    ],
)
def test_bad_settings_are_clear_errors_before_any_work(values, message):
    with pytest.raises(UserError, match=message):
        load_config(values=values)


def test_muon_steps_fp8_layers():
    """torchao's Float8Linear keeps its weight a plain high-precision parameter: Muon updates
    it as any block matrix (fp8-emulate: the FP8 path on a CPU)."""
    from hanlm.train import precision

    model = tiny()
    numerics = precision.resolve("fp8-emulate", "cpu")
    converted = precision.apply_fp8(model, numerics, min_features=16)
    assert converted
    optimizer = build_optimizer(OptimizerSection(name="muon", lr=1e-2), model, "cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with numerics.autocast_context("cpu"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    muon_names = {n for n, p in model.named_parameters() if any(
        p is q for q in optimizer.muon.param_groups[0]["params"])}  # fmt: skip
    assert muon_names and muon_names <= moved
    assert all(torch.isfinite(p).all() for p in model.parameters())
