"""Precision plans, device refusals, the FP8 conversion and FP8 (emulated) training on CPU."""

from __future__ import annotations

import copy
import logging
import subprocess
import sys

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from hanlm import import_noise
from hanlm.errors import UserError
from hanlm.train import precision
from hanlm.train.precision import apply_fp8, describe, resolve

CPU = torch.device("cpu")
VOCAB = 256


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # k/v projections are 64 -> 32: below the default min_features
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=False,  # a separate lm_head, which must stay high precision
    )
    return LlamaForCausalLM(config)


def fake_gpu(monkeypatch, name: str, capability: tuple[int, int], bf16: bool = True):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    return torch.device("cuda")


def class_name(model: nn.Module, name: str) -> str:
    return type(model.get_submodule(name)).__name__


# --- resolve ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "compute", "autocast", "fp8", "recipe"),
    [
        ("fp32", torch.float32, False, False, None),
        ("bf16", torch.bfloat16, True, False, None),
        ("fp8-emulate", torch.float32, False, True, "tensorwise"),
    ],
)
def test_cpu_plans(name, compute, autocast, fp8, recipe):
    numerics = resolve(name, CPU)
    assert numerics.name == name
    assert numerics.param_dtype == torch.float32
    assert numerics.compute_dtype == compute
    assert numerics.autocast is autocast
    assert numerics.fp8 is fp8
    assert numerics.recipe == recipe
    assert name in describe(numerics) and "\n" not in describe(numerics)


def test_fp8_emulate_keeps_the_recipe():
    assert resolve("fp8-emulate", "cpu", recipe="rowwise").recipe == "rowwise"


def test_fp8_on_cpu_points_to_emulation():
    with pytest.raises(UserError, match="fp8-emulate") as info:
        resolve("fp8", CPU)
    assert "8.9" in str(info.value) and "CPU" in str(info.value)


def test_fp4_refused_with_the_field_reason():
    with pytest.raises(UserError) as info:
        resolve("fp4", CPU)
    message = str(info.value)
    assert "overhead" in message and "waiting on the CPU" in message
    assert "--precision fp8" in message


def test_unknown_names_list_the_choices():
    with pytest.raises(UserError, match="fp32, bf16, fp8, fp8-emulate"):
        resolve("fp16", CPU)
    with pytest.raises(UserError, match="tensorwise, rowwise"):
        resolve("fp8-emulate", CPU, recipe="blockwise")


def test_fp8_refused_below_ada(monkeypatch):
    gpu = fake_gpu(monkeypatch, "NVIDIA GeForce RTX 3090", (8, 6))
    with pytest.raises(UserError) as info:
        resolve("fp8", gpu)
    message = str(info.value)
    assert "NVIDIA GeForce RTX 3090" in message and "8.6" in message
    assert "--precision bf16" in message


@pytest.mark.parametrize(
    ("name", "capability"),
    [("NVIDIA GeForce RTX 4090", (8, 9)), ("NVIDIA H100 80GB HBM3", (9, 0))],
)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_accepted_from_ada(monkeypatch, name, capability, recipe):
    numerics = resolve("fp8", fake_gpu(monkeypatch, name, capability), recipe=recipe)
    assert (numerics.fp8, numerics.recipe, numerics.autocast) == (True, recipe, True)
    assert (numerics.param_dtype, numerics.compute_dtype) == (torch.float32, torch.bfloat16)


def test_rowwise_refused_on_consumer_blackwell(monkeypatch):
    gpu = fake_gpu(monkeypatch, "NVIDIA GeForce RTX 5090", (12, 0))
    with pytest.raises(UserError, match="tensorwise") as info:
        resolve("fp8", gpu, recipe="rowwise")
    assert "RTX 5090" in str(info.value) and "12.0" in str(info.value)
    assert resolve("fp8", gpu, recipe="tensorwise").recipe == "tensorwise"


def test_rowwise_on_ada_needs_a_recent_pytorch(monkeypatch):
    gpu = fake_gpu(monkeypatch, "NVIDIA L4", (8, 9))
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.raises(UserError, match=r"PyTorch 2\.7 or newer"):
        resolve("fp8", gpu, recipe="rowwise")
    assert resolve("fp8", fake_gpu(monkeypatch, "NVIDIA H100", (9, 0)), recipe="rowwise").fp8


def test_bf16_refused_without_native_support(monkeypatch):
    gpu = fake_gpu(monkeypatch, "Tesla V100-SXM2-16GB", (7, 0), bf16=False)
    with pytest.raises(UserError, match="fp32") as info:
        resolve("bf16", gpu)
    assert "Tesla V100" in str(info.value)
    with pytest.raises(UserError, match="--precision fp32"):
        resolve("fp8", gpu)
    assert resolve("fp32", gpu).compute_dtype == torch.float32


# --- apply_fp8 -------------------------------------------------------------------------------


def test_apply_fp8_converts_projections_but_not_the_head():
    model = tiny_llama()
    names = apply_fp8(model, resolve("fp8-emulate", CPU), min_features=16)
    attention = [f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    mlp = [f"mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    expected = {f"model.layers.{i}.{p}" for i in range(2) for p in attention + mlp}
    assert set(names) == expected
    assert all(class_name(model, n) == "Float8Linear" for n in names)
    assert type(model.lm_head) is nn.Linear


def test_apply_fp8_keeps_small_layers():
    model = tiny_llama()
    names = apply_fp8(model, resolve("fp8-emulate", CPU))  # min_features=64
    kept = {n for n, m in model.named_modules() if type(m) is nn.Linear}
    assert "model.layers.0.self_attn.k_proj" in kept  # 64 -> 32
    assert "model.layers.0.self_attn.q_proj" in names  # 64 -> 64
    assert kept.isdisjoint(names)
    assert len(names) == 10


def test_apply_fp8_keeps_dims_not_multiple_of_16():
    model = nn.Sequential(nn.Linear(64, 80), nn.Linear(80, 72), nn.Linear(72, 64))
    assert apply_fp8(model, resolve("fp8-emulate", CPU), min_features=16) == ["0"]


def test_apply_fp8_is_a_noop_without_fp8():
    model = tiny_llama()
    assert apply_fp8(model, resolve("bf16", CPU)) == []
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))


def test_fsdp_float8_all_gather_needs_tensorwise():
    with pytest.raises(UserError, match="tensorwise"):
        apply_fp8(
            tiny_llama(),
            resolve("fp8-emulate", CPU, recipe="rowwise"),
            fsdp_float8_all_gather=True,
        )


def test_fsdp_float8_all_gather_wraps_weights():
    model = tiny_llama()
    numerics = resolve("fp8-emulate", CPU)
    names = apply_fp8(model, numerics, min_features=16, fsdp_float8_all_gather=True)
    weight = model.get_submodule(names[0]).weight
    assert type(weight.data).__name__ == "WeightWithDynamicFloat8CastTensor"
    tokens = torch.randint(0, VOCAB, (2, 16))
    model(input_ids=tokens, labels=tokens).loss.backward()
    # Without FSDP there are no sharded FP8 weights: a no-op, not an error.
    precision.precompute_fp8_scales_if_needed(model, numerics, fsdp_float8_all_gather=True)


def test_torchao_import_noise_is_dropped_and_nothing_else(caplog):
    """Exactly torchao's CUDA-less extension failures and its enums' pytree deprecations go;
    every other record of those loggers stays."""
    import enum

    import_noise.install()
    import_noise.install()  # idempotent: one filter per logger
    torchao_logger = logging.getLogger("torchao")
    pytree_logger = logging.getLogger("torch.utils._pytree")
    assert len(torchao_logger.filters) == len(set(map(type, torchao_logger.filters)))

    torchao_enum = enum.Enum("KernelPreference", "AUTO")
    torchao_enum.__module__ = "torchao.quantization.quantize_.common"
    other_enum = enum.Enum("Colour", "RED")
    deprecation = "%s is an Enum subclass ... Calling register_constant() on Enum subclasses"
    with caplog.at_level(logging.INFO):
        so = "/venv/lib/python3.11/site-packages/torchao/_C_cutlass_90a.abi3.so"
        torchao_logger.warning(f"Failed to load {so}: Could not load this library: {so}")
        torchao_logger.warning("Skipping import of cpp extensions due to incompatible torch")
        torchao_logger.warning("Failed to load my_model.so: not torchao's")
        pytree_logger.warning(deprecation, torchao_enum)
        pytree_logger.warning(deprecation, other_enum)
    shown = [r.getMessage() for r in caplog.records]
    expected_failure_shown = torch.cuda.is_available()  # with CUDA a failure means a mismatch
    assert any("_C_cutlass_90a" in m for m in shown) == expected_failure_shown
    assert "Skipping import of cpp extensions due to incompatible torch" in shown
    assert "Failed to load my_model.so: not torchao's" in shown
    assert not any("KernelPreference" in m for m in shown)
    assert any("Colour" in m for m in shown)


def test_importing_torchao_through_hanlm_prints_no_failures():
    code = "import hanlm.model, torchao.float8, transformers; from hanlm.train import export"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "Failed to load" not in result.stderr
    assert "register_constant" not in result.stderr


# --- compile: FP8 pays only compiled ---------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "requested", "enabled", "says"),
    [
        ("fp8", None, True, "compiling each decoder block"),  # unset: FP8 compiles
        ("fp8", True, True, None),
        ("fp8", False, False, "slower than --precision bf16"),  # eager on request, warned
        ("fp8-emulate", None, False, None),  # the CPU emulation compiles only when asked
        ("fp8-emulate", True, True, None),
        ("bf16", None, False, None),
        ("bf16", True, True, None),
        ("fp32", False, False, None),
    ],
)
def test_compile_choice(mode, requested, enabled, says):
    choice = precision.compile_choice(mode, requested)
    assert choice.enabled is enabled
    if says is None:
        assert choice.note is None
    else:
        assert says in choice.note and "parallel.compile" in choice.note
        assert choice.warning is (requested is False)


def test_fp8_announces_its_compile_on_the_main_rank_only(monkeypatch, capsys):
    numerics = resolve("fp8", fake_gpu(monkeypatch, "NVIDIA H100", (9, 0)))
    assert precision.blocks_compiled(numerics, None, announce=True)
    assert "FP8: compiling each decoder block" in capsys.readouterr().err
    assert precision.blocks_compiled(numerics, None, announce=False)
    assert capsys.readouterr().err == ""
    assert not precision.blocks_compiled(numerics, False, announce=True)
    assert "warning:" in capsys.readouterr().err


def test_rowwise_compile_emulates_eager_casts():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(emulate_precision_casts=False):  # restored after the test
        tensorwise = resolve("fp8-emulate", CPU)
        assert precision.blocks_compiled(tensorwise, True, announce=False)
        assert inductor_config.emulate_precision_casts is False
        rowwise = resolve("fp8-emulate", CPU, recipe="rowwise")
        assert not precision.blocks_compiled(rowwise, None, announce=False)
        assert inductor_config.emulate_precision_casts is False  # not compiled: left alone
        assert precision.blocks_compiled(rowwise, True, announce=False)
        assert inductor_config.emulate_precision_casts is True


def test_compile_is_unset_by_default():
    import tomllib

    from hanlm.config import Config, config_to_toml

    assert Config().parallel.compile is None
    # unset stays unset in a saved config, so that fp8 still decides when it is loaded again
    assert "compile" not in tomllib.loads(config_to_toml(Config()))["parallel"]
    off = Config.model_validate({"parallel": {"compile": False}})
    assert tomllib.loads(config_to_toml(off))["parallel"]["compile"] is False


def test_the_docs_recipe_table_is_the_data():
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "fp8.md").read_text()
    assert precision.recipe_table() in docs
    rows = precision.FP8_RECIPE_EVIDENCE
    assert {r.recipe for r in rows} == {*precision.FP8_RECIPES, "both"}
    # every row says what hanlm saw, or that it has not measured it: never blank
    assert all(r.hanlm.strip() for r in rows)
    # hanlm's own figures name the script that measured them
    measured = [
        r for r in rows if r.hanlm not in (precision.NOT_MEASURED, "refused before training")
    ]
    assert all("benchmarks/" in r.source or "tests/" in r.source for r in measured)


@pytest.mark.slow
def test_compiled_float8_blocks_match_eager_on_cpu(one_thread):
    """torch 2.13's inductor compiles decoder blocks holding (emulated) Float8Linear on a CPU,
    as `parallelize` does, and they compute what the eager ones do."""
    from hanlm.train import parallel

    numerics = resolve("fp8-emulate", CPU)
    eager = tiny_llama()
    apply_fp8(eager, numerics, min_features=16)
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    assert precision.blocks_compiled(numerics, True, announce=False)
    parallel.parallelize(compiled, parallel.Dist(0, 1, 0, CPU), "single", compile_blocks=True)
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(2))
    losses = [m(input_ids=tokens, labels=tokens).loss for m in (eager, compiled)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj"):
        assert class_name(compiled, name) == "Float8Linear"
        torch.testing.assert_close(
            compiled.get_submodule(name).weight.grad,
            eager.get_submodule(name).weight.grad,
            rtol=1e-4,
            atol=1e-6,
        )
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] >= 1  # inductor really compiled the blocks


# --- numerics --------------------------------------------------------------------------------


def train(model: nn.Module, batches: list[torch.Tensor], steps: int) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        tokens = batches[step % len(batches)]
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.fixture
def one_thread():
    # A tiny model trains several times faster on one thread than on a busy shared CPU.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fp8_emulate_trains_like_fp32(one_thread):
    reference = tiny_llama()
    fp8 = copy.deepcopy(reference)
    assert len(apply_fp8(fp8, resolve("fp8-emulate", CPU), min_features=16)) == 14
    generator = torch.Generator().manual_seed(1)
    # A few batches seen again and again: random tokens are learnable only by memorising them.
    batches = [torch.randint(0, VOCAB, (8, 32), generator=generator) for _ in range(4)]

    with torch.no_grad():
        gap = (reference(input_ids=batches[0]).logits - fp8(input_ids=batches[0]).logits).abs()
    assert 0 < gap.max() < 0.2  # FP8 rounding happened, and only rounding (measured: 0.033)

    fp32_losses = train(reference, batches, steps=30)
    fp8_losses = train(fp8, batches, steps=30)
    assert fp32_losses[-1] < fp32_losses[0] - 0.5  # measured: 5.55 -> 4.55
    assert fp8_losses[-1] < fp8_losses[0] - 0.5
    relative = [abs(a - b) / a for a, b in zip(fp32_losses, fp8_losses, strict=True)]
    assert max(relative) < 0.01  # measured: at most 0.10% on any step, 0.03% on average


def test_fp8_emulate_rowwise_runs_close_to_fp32(one_thread):
    reference = tiny_llama()
    fp8 = copy.deepcopy(reference)
    apply_fp8(fp8, resolve("fp8-emulate", CPU, recipe="rowwise"), min_features=16)
    tokens = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(1))
    fp32_loss = reference(input_ids=tokens, labels=tokens).loss
    fp8_loss = fp8(input_ids=tokens, labels=tokens).loss
    fp8_loss.backward()
    assert fp8_loss != fp32_loss
    assert abs(fp8_loss - fp32_loss) / fp32_loss < 0.01
    assert fp8.model.layers[0].mlp.down_proj.weight.grad is not None


def test_bf16_autocast_on_cpu():
    model = tiny_llama()
    numerics = resolve("bf16", CPU)
    tokens = torch.randint(0, VOCAB, (2, 16))
    with numerics.autocast_context(CPU):
        logits = model(input_ids=tokens).logits
    assert logits.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32  # master weights stay fp32


def test_no_autocast_for_fp32():
    numerics = resolve("fp32", CPU)
    with numerics.autocast_context(CPU):
        assert not torch.is_autocast_enabled("cpu")
