"""The chunked loss: the same loss and gradients as the float32 cross-entropy of the full logits,
for every chunk size, ignored labels, SFT's masked prompts, distillation and validation's
per-token losses; bad settings are user errors. Under DDP and FSDP2: in test_two_ranks.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from conftest import assert_close
from hanlm.config import load_config
from hanlm.errors import UserError
from hanlm.model import build_model, model_config
from hanlm.train import loss as loss_lib
from hanlm.train.distill import TeacherObjective, kd_loss_sums
from hanlm.train.loss import IGNORE, CausalLMWithLoss, TokenLoss

ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-5
VOCAB, SEQ = 97, 12


def reference_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.float().view(-1, logits.size(-1)),
        labels.view(-1),
        ignore_index=IGNORE,
        reduction="sum",
    )


def lm_batch(rows: int = 3, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels, the last position and part of one row ignored."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
    labels = inputs.roll(-1, dims=1)
    labels[:, -1] = IGNORE
    labels[1, 2:6] = IGNORE
    return inputs, labels


def sft_labels(inputs: torch.Tensor) -> torch.Tensor:
    """SFT's labels: the prompt masked, padding masked, a row with nothing to learn."""
    labels = inputs.roll(-1, dims=1)
    labels[:, :5] = IGNORE  # the prompt
    labels[0, 9:] = IGNORE  # padding after a short answer
    labels[2, :] = IGNORE  # a row that is all prompt
    return labels


# Chunk sizes that divide the 36 tokens, do not, are 1, and exceed them.
CHUNKS = [1, 5, 12, 36, 1000]


@pytest.mark.parametrize("chunk_tokens", CHUNKS)
def test_chunked_sums_equal_the_full_logits_with_gradients(chunk_tokens):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, SEQ, 16, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 16, generator=g, requires_grad=True)
    _, labels = lm_batch()
    expected = reference_sum(hidden @ weight.T, labels)
    expected_grads = torch.autograd.grad(expected, [hidden, weight])

    got = loss_lib.chunked_loss_sums(hidden, weight, labels, chunk_tokens=chunk_tokens)
    assert set(got) == {"loss"}
    assert got["loss"].item() == pytest.approx(expected.item(), rel=RTOL)
    for grad, want in zip(
        torch.autograd.grad(got["loss"], [hidden, weight]), expected_grads, strict=True
    ):
        assert_close(grad, want)


def test_the_incoming_gradient_scales_the_precomputed_ones():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, SEQ, 8, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=g, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    expected = torch.autograd.grad(reference_sum(hidden @ weight.T, labels) * 0.37, [hidden])[0]
    got = loss_lib.chunked_loss_sums(hidden, weight, labels, chunk_tokens=7)["loss"] * 0.37
    assert_close(torch.autograd.grad(got, [hidden])[0], expected)


def test_a_second_backward_is_refused_not_wrong():
    hidden = torch.randn(2, SEQ, 8, requires_grad=True)
    weight = torch.randn(VOCAB, 8, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, SEQ))
    loss = loss_lib.chunked_loss_sums(hidden, weight, labels, chunk_tokens=5)["loss"]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        loss.backward()


def test_without_grad_mode_nothing_is_differentiated():
    hidden = torch.randn(2, SEQ, 8, requires_grad=True)
    weight = torch.randn(VOCAB, 8, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        got = loss_lib.chunked_loss_sums(hidden, weight, labels, chunk_tokens=5)["loss"]
    assert not got.requires_grad
    assert got.item() == pytest.approx(reference_sum(hidden @ weight.T, labels).item(), rel=RTOL)


def tiny_model(seed: int = 0):
    return build_model(model_config("tiny", vocab_size=VOCAB, seq_len=SEQ), seed=seed)


def model_and_reference_grads(labels_of, chunk_tokens: int):
    """(loss through CausalLMWithLoss, reference loss, their parameters' gradients by name)."""
    model = tiny_model()
    reference = copy.deepcopy(model)
    inputs, _ = lm_batch()
    labels = labels_of(inputs)
    expected = reference_sum(reference(input_ids=inputs).logits, labels)
    expected.backward()
    got = CausalLMWithLoss(model)(
        labels=labels, loss_fn=TokenLoss(chunk_tokens).sums, input_ids=inputs
    )["loss"]
    got.backward()
    grads = dict(model.named_parameters())
    return got, expected, {n: (grads[n].grad, p.grad) for n, p in reference.named_parameters()}


@pytest.mark.parametrize("chunk_tokens", [5, 12])
@pytest.mark.parametrize("labels_of", [lambda x: lm_batch()[1], sft_labels], ids=["lm", "sft"])
def test_a_model_ending_in_the_loss_has_the_reference_gradients(labels_of, chunk_tokens):
    got, expected, grads = model_and_reference_grads(labels_of, chunk_tokens)
    assert got.item() == pytest.approx(expected.item(), rel=RTOL)
    assert "model.embed_tokens.weight" in grads  # tied: input embedding and output head
    assert "lm_head.weight" not in grads
    for name, (grad, want) in grads.items():
        assert grad is not None, name
        assert_close(grad, want)


def test_per_token_losses_equal_the_unreduced_cross_entropy():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, SEQ, 16, generator=g)
    weight = torch.randn(VOCAB, 16, generator=g)
    labels = sft_labels(lm_batch()[0])
    expected = F.cross_entropy(
        (hidden @ weight.T).view(-1, VOCAB), labels.view(-1), ignore_index=IGNORE, reduction="none"
    )
    got = TokenLoss(7).token_losses(hidden, weight, labels)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert_close(got, expected)
    assert (got[labels.view(-1) == IGNORE] == 0).all()


@pytest.mark.parametrize("chunk_tokens", [5, 36])
def test_distillation_in_chunks_equals_the_full_logits(chunk_tokens):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, SEQ, 16, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 16, generator=g, requires_grad=True)
    teacher_hidden = torch.randn(3, SEQ, 24, generator=g)
    teacher_head = torch.randn(VOCAB, 24, generator=g)
    labels = sft_labels(lm_batch()[0])
    settings = {"alpha": 0.3, "temperature": 2.0}
    expected = kd_loss_sums(hidden @ weight.T, teacher_hidden @ teacher_head.T, labels, **settings)
    expected_grads = torch.autograd.grad(expected["loss"], [hidden, weight])

    objective = TeacherObjective(teacher_hidden, teacher_head, **settings)
    got = TokenLoss(chunk_tokens).sums(hidden, weight, labels, objective=objective)
    assert set(got) == {"loss", "ce", "kl"}
    for part in ("loss", "ce", "kl"):
        assert got[part].item() == pytest.approx(expected[part].item(), rel=RTOL), part
    assert not got["ce"].requires_grad and not got["kl"].requires_grad
    for grad, want in zip(
        torch.autograd.grad(got["loss"], [hidden, weight]), expected_grads, strict=True
    ):
        assert_close(grad, want)


def test_under_bf16_autocast_the_head_runs_in_bf16_as_before():
    """The old path's logits came from the head under autocast; the chunks' do too."""
    model = tiny_model()
    inputs, labels = lm_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=inputs).logits
        got = CausalLMWithLoss(model)(labels=labels, loss_fn=TokenLoss(5).sums, input_ids=inputs)
    assert logits.dtype == torch.bfloat16
    expected = reference_sum(logits, labels)
    # per-chunk bf16 matmuls round like the whole one, not bit for bit
    assert got["loss"].item() == pytest.approx(expected.item(), rel=1e-3)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_a_bad_chunk_size_is_a_user_error(bad):
    with pytest.raises(UserError, match=r"parallel\.loss_chunk_tokens"):
        TokenLoss(bad)
    with pytest.raises(UserError, match="loss chunk size"):
        loss_lib.chunked_loss_sums(
            torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2).long(), chunk_tokens=bad
        )


def test_a_bad_chunk_size_in_the_config_is_a_user_error():
    with pytest.raises(UserError, match=r"parallel\.loss_chunk_tokens"):
        load_config(overrides=["parallel.loss_chunk_tokens=0"])
    with pytest.raises(UserError, match=r"parallel\.loss_kernel"):
        load_config(overrides=["parallel.loss_kernel=fused"])
    cfg = load_config(overrides=["parallel.loss_chunk_tokens=256"])
    assert cfg.parallel.loss_chunk_tokens == 256


def test_a_config_without_the_loss_keys_loads_with_the_defaults(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('[parallel]\nmode = "fsdp"\n')
    cfg = load_config(path)
    assert cfg.parallel.loss_chunk_tokens == loss_lib.DEFAULT_CHUNK_TOKENS
    assert cfg.parallel.loss_kernel == "chunked"


def test_liger_is_refused_off_cuda_and_auto_falls_back():
    with pytest.raises(UserError, match="CUDA only"):
        TokenLoss.from_settings(1024, "liger", "cpu")
    assert TokenLoss.from_settings(1024, "auto", "cpu").kernel == "chunked"
    with pytest.raises(UserError, match="unknown loss kernel"):
        loss_lib.resolve_kernel("fused", "cpu")


def test_a_model_transforming_its_logits_is_refused():
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        final_logit_softcapping=30.0,
    )
    with pytest.raises(UserError, match="final_logit_softcapping"):
        CausalLMWithLoss(build_model(config))


def test_with_loss_wraps_a_plain_model_once():
    model = tiny_model()
    wrapped = loss_lib.with_loss(model)
    assert isinstance(wrapped, CausalLMWithLoss) and wrapped.module is model
    assert loss_lib.with_loss(wrapped) is wrapped


def test_the_memory_benchmark_smoke_run_holds_less_for_the_same_loss():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    script = ROOT / "benchmarks" / "loss_memory.py"
    result = subprocess.run(
        [sys.executable, str(script), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["loss_relative_difference"] < 1e-4
    # 1,024 tokens x 8,192 vocab: the full logits hold ~7x what chunks of 96 tokens hold
    assert figures["ratio"] > 2, result.stdout


@pytest.mark.slow
def test_compiled_blocks_make_one_graph_for_every_layer():
    """Training's forward builds no KV cache: with one, dynamo guarded each block on its own
    cache layer and recompiled per layer until its recompile limit (8), leaving the rest eager."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from hanlm import model as model_lib
    from hanlm.train import parallel
    from hanlm.train.loss import TokenLoss

    torch._dynamo.reset()
    counters.clear()
    config = model_lib.model_config("tiny", vocab_size=256, seq_len=32)
    config.num_hidden_layers = 12
    model = model_lib.build_model(config, seed=0, device="cpu")
    alone = parallel.Dist(0, 1, 0, torch.device("cpu"))
    root = parallel.parallelize(model, alone, "single", compile_blocks=True)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    root(labels=ids, loss_fn=TokenLoss().sums, input_ids=ids)["loss"].backward()
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
