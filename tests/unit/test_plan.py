"""`hanlm plan`: the field report's figures, byte counts against real tensors, activations
against PyTorch's memory tracker, and the command's answers to incomplete or wrong input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig

from conftest import assert_user_error
from hanlm.model import PRESETS, build_model, model_config
from hanlm.plan import inputs, memory_model, recipe, time_model
from hanlm.plan.estimate import recommend
from hanlm.train import precision as precision_lib
from hanlm.train.memtrace import measure_step
from hanlm.train.optim import adamw

GIB = 1 << 30

FIELD = inputs.FIELD_REPORT


@pytest.fixture(scope="module")
def field_shapes() -> inputs.Shapes:
    return inputs.model_shapes("1.3b", vocab_size=65536, seq_len=2048)


def test_one_rtx5090_cannot_train_the_field_model(field_shapes):
    mem = memory_model.memory(FIELD, field_shapes)
    assert not mem.fits
    state = sum(mem.items[k] for k in list(mem.items)[:3])
    # the report's lesson: model and AdamW states alone take most of the 32 GB card
    assert 20 * GIB <= state < 21 * GIB
    assert mem.total > 32 * GIB


@pytest.mark.parametrize("gpus", [4, 8])
def test_fsdp_over_four_or_eight_fits(field_shapes, gpus):

    mem = memory_model.memory(replace(FIELD, gpus=gpus, parallel="fsdp"), field_shapes)
    assert mem.fits and mem.margin > 2 * GIB


def test_field_report_gpu_hours_and_cost(field_shapes):

    t = time_model.throughput(replace(FIELD, gpus=8, parallel="fsdp"), field_shapes)
    assert t.gpu_hours == pytest.approx(590, rel=0.01)
    assert t.cost == pytest.approx(235, rel=0.02)  # "about 240 USD"
    # counting attention FLOPs at the same MFU adds about 15% for this model at 2,048 tokens
    assert t.attention_adds == pytest.approx(0.15, abs=0.01)
    assert t.cost_with_attention == pytest.approx(t.cost * (1 + t.attention_adds))


def test_recommendation_is_the_cheapest_fitting_option(field_shapes):

    rec = recommend(replace(FIELD, gpus=8, parallel="fsdp"), field_shapes)
    best = rec["best"]
    # full recomputation lets one card hold micro-batch 1, at a third more compute: never best
    assert best["recompute"] == "none" and best["parallel"] == "fsdp" and best["gpus"] >= 4
    for alternative in rec["alternatives"]:
        assert alternative["gpu_hours"] >= best["gpu_hours"] - 1e-9


@pytest.mark.parametrize("preset", list(PRESETS))
def test_parameter_count_equals_the_built_model(preset):
    shapes = inputs.model_shapes(preset, vocab_size=4096, seq_len=128)
    model = build_model(model_config(preset, vocab_size=4096, seq_len=128), device="meta")
    assert shapes.n_params == sum(p.numel() for p in model.parameters())


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _one_step(model: torch.nn.Module, recipe) -> torch.optim.Optimizer:
    """One AdamW step of `model` on random tokens under `recipe`'s autocast: its optimizer."""
    optimizer = adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device="cpu")
    ids = torch.randint(0, 512, (2, 32))
    with recipe.autocast_context("cpu"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    return optimizer


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8-emulate"])
def test_model_state_bytes_equal_the_real_tensors_after_a_step(precision):
    config = model_config("tiny", vocab_size=512, seq_len=32)
    model = build_model(config)
    recipe = precision_lib.resolve(precision, "cpu")
    precision_lib.apply_fp8(model, recipe)
    optimizer = _one_step(model, recipe)

    expected = memory_model.model_state_bytes(
        inputs.model_shapes("tiny", vocab_size=512, seq_len=32), world=1, parallel="single"
    )
    params = list(model.parameters())
    assert expected["weights"] == _tensor_bytes(params)
    assert expected["gradients"] == _tensor_bytes(p.grad for p in params)
    states = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert expected["optimizer"] == _tensor_bytes(states)


def test_muon_state_bytes_equal_the_real_tensors_after_a_step():
    """Muon keeps one buffer per block matrix and AdamW's two moments (and step) elsewhere; the
    plan adds the one whole matrix Newton-Schulz works on at a time."""
    from hanlm.config import OptimizerSection
    from hanlm.train.build import build_optimizer

    model = build_model(model_config("tiny", vocab_size=512, seq_len=32))
    optimizer = build_optimizer(OptimizerSection(name="muon"), model, "cpu")
    ids = torch.randint(0, 512, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    shapes = inputs.model_shapes("tiny", vocab_size=512, seq_len=32)
    expected = memory_model.model_state_bytes(shapes, world=1, parallel="single", optimizer="muon")
    states = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    largest = max(p.numel() for p in optimizer.muon.param_groups[0]["params"])
    assert expected["optimizer"] == _tensor_bytes(states) + (4 + 3 * 2) * largest
    adamw_state = memory_model.model_state_bytes(shapes, world=1, parallel="single")["optimizer"]
    assert expected["optimizer"] < adamw_state


def test_the_field_setup_with_muon_needs_less_memory():
    muon = replace(FIELD, optimizer="muon")
    items = memory_model.memory(muon).items
    assert (
        items[memory_model.OPTIMIZER_ITEM["muon"]]
        < 0.6 * memory_model.memory(FIELD).items[memory_model.OPTIMIZER_ITEM["adamw"]]
    )
    assert memory_model.memory(muon).total < memory_model.memory(FIELD).total
    timing = time_model.throughput(
        muon, inputs.model_shapes("1.3b", vocab_size=65536, seq_len=2048)
    )
    assert "no token-efficiency factor" in timing.optimizer_note


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lora_state_bytes_equal_the_real_tensors_after_a_step(precision):
    """LoRA's plan: the frozen weights once (the blocks' linears in bf16 under bf16), gradients
    and AdamW states for the adapters and the trained rows only, as PEFT's model holds them
    after a step."""
    from hanlm.config import SftLoraSection
    from hanlm.train import lora

    config = model_config("tiny", vocab_size=512, seq_len=32)
    section = SftLoraSection(rank=4, target_modules=["q_proj", "v_proj", "down_proj"])
    _, model = lora.Adapters(section, (4, 5, 6, 7)).inject(build_model(config))
    recipe = precision_lib.resolve(precision, "cpu")
    lora.hold_frozen_linears(model, recipe.compute_dtype)
    optimizer = _one_step(model, recipe)

    shapes = inputs.model_shapes("tiny", vocab_size=512, seq_len=32)
    planned = inputs.LoraPlan(4, ("q_proj", "v_proj", "down_proj"), token_rows=4)
    expected = memory_model.model_state_bytes(
        shapes, world=1, parallel="single", lora=planned, precision=precision
    )
    params = list(dict.fromkeys(model.parameters()))
    trained = [p for p in params if p.requires_grad]
    assert expected["weights"] == _tensor_bytes(params)
    assert expected["gradients"] == _tensor_bytes(p.grad for p in trained)
    states = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert expected["optimizer"] == _tensor_bytes(states)
    full = memory_model.model_state_bytes(shapes, world=1, parallel="single")
    assert expected["optimizer"] < full["optimizer"] / 10


def test_fsdp_shards_are_ceil_rows_per_rank():
    shapes = inputs.model_shapes("tiny", vocab_size=512, seq_len=32)
    one = memory_model.model_state_bytes(shapes, world=1, parallel="single")
    three = memory_model.model_state_bytes(shapes, world=3, parallel="fsdp")
    expected = sum(-(-s[0] // 3) * (s[1] if len(s) > 1 else 1) for s in shapes.params) * 4
    assert three["weights"] == expected
    assert one["weights"] / 3 <= three["weights"] < one["weights"] / 3 + 4 * 3 * 64 * 20


def _hand_shapes() -> inputs.Shapes:
    """A made-up model small enough to count by hand: 2 layers of 1,000 parameters, a root
    (embedding, norm) of 5,000; two tensors, (10, 4) and (3,), for the per-rank state."""
    return inputs.Shapes(
        params=[(10, 4), (3,)],
        layer_params=1000,
        root_params=5000,
        matmul_weights=6000,
        embedding=4900,
        hidden=100,
        query_width=100,
        kv_width=100,
        ffn=400,
        heads=4,
        head_dim=25,
        layers=2,
        vocab=49,
        n_params=7000,
        flops={"six_n": 42000, "total": 50000, "dense": 36000},
    )


def _setup(**overrides) -> inputs.Setup:
    values = {"model": "tiny", "vocab_size": 49, "seq_len": 8, "micro_batch": 1, "gpu": "h100"}
    return inputs.Setup(**{**values, **overrides})


@pytest.mark.parametrize(
    "precision,gathered,before_reduce",
    # two layers gathered and the root; one layer's gradients and its fp32 reduce-scatter input
    [("fp32", 4 * (2 * 1000 + 5000), (4 + 4) * 1000), ("bf16", 2 * (2 * 1000 + 5000), 6 * 1000)],
)
def test_fsdp_holds_gathered_layers_and_full_gradients_before_the_reduce_scatter(
    precision, gathered, before_reduce
):
    shapes = _hand_shapes()
    fsdp = _setup(gpus=2, parallel="fsdp", precision=precision)
    assert memory_model.working_copy_bytes(shapes, fsdp) == gathered  # fp32 gathers too
    assert memory_model.fsdp_gradient_bytes(shapes, fsdp) == before_reduce
    alone = _setup(gpus=1, parallel="fsdp", precision=precision)  # one rank: nothing sharded
    ddp = _setup(gpus=2, parallel="ddp", precision=precision)
    for unsharded in (alone, ddp):
        assert memory_model.fsdp_gradient_bytes(shapes, unsharded) == 0
        expected = 0 if precision == "fp32" else 2 * 6000  # autocast's casts, not gathers
        assert memory_model.working_copy_bytes(shapes, unsharded) == expected


def test_an_async_save_stages_the_ranks_weights_and_adamw_state_on_the_host():
    shapes = _hand_shapes()
    # FSDP over 2: ceil(10 / 2) x 4 + ceil(3 / 2) = 22 elements a rank; 2 AdamW step scalars
    fsdp = _setup(gpu="cpu", gpus=2, parallel="fsdp")
    assert memory_model.checkpoint_staging_bytes(shapes, fsdp) == 4 * 22 + (8 * 22 + 4 * 2)
    # DDP: rank 0 stages the whole replica, 43 elements
    ddp = _setup(gpu="cpu", gpus=2, parallel="ddp")
    assert memory_model.checkpoint_staging_bytes(shapes, ddp) == 4 * 43 + (8 * 43 + 4 * 2)
    assert memory_model.checkpoint_staging_bytes(shapes, _setup(async_checkpoint=False)) == 0


def test_only_a_cpu_plan_counts_the_staging_and_a_cpu_runtime():
    shapes = inputs.model_shapes("tiny", vocab_size=512, seq_len=32)
    on_cpu = memory_model.memory(
        _setup(gpu="cpu", gpus=2, parallel="fsdp", precision="fp32"), shapes
    )
    on_gpu = memory_model.memory(_setup(gpus=2, parallel="fsdp", precision="fp32"), shapes)
    staging = "checkpoint staging (async save)"
    assert on_cpu.items[staging] > 0 and staging not in on_gpu.items
    assert set(on_gpu.items) <= set(on_cpu.items)
    for mem, runtime in (
        (on_cpu, memory_model.CPU_RUNTIME_GIB),
        (on_gpu, memory_model.FRAMEWORK_GIB),
    ):
        subtotal = sum(v for k, v in mem.items.items() if k != "framework allowance")
        assert mem.items["framework allowance"] == int(
            runtime * GIB + memory_model.FRAGMENTATION * subtotal
        )
        assert mem.total == subtotal + mem.items["framework allowance"]
    # the single-process plan has the same items, FSDP's at zero (the report card compares them)
    single = memory_model.memory(_setup(), shapes)
    assert list(single.items) == list(on_gpu.items)
    assert single.items["gradients before reduce-scatter"] == 0


@pytest.mark.parametrize("tied", [True, False])
def test_the_root_is_everything_outside_the_decoder_layers(tmp_path, tied):
    config = model_config("tiny", vocab_size=512, seq_len=32)
    config.tie_word_embeddings = tied
    config.to_json_file(tmp_path / "config.json")
    shapes = inputs.model_shapes(str(tmp_path / "config.json"), vocab_size=512, seq_len=32)
    hidden = config.hidden_size
    # the embedding, the head when untied, and the final norm
    assert shapes.root_params == (1 if tied else 2) * 512 * hidden + hidden


def test_the_config_says_whether_saves_are_staged():
    from hanlm.config import load_config

    for async_save in (True, False):
        cfg = load_config(values={"plan.gpu": "cpu", "checkpoint.async_save": async_save})
        assert recipe.setup_from_config(cfg, with_data=False).async_checkpoint is async_save


def test_the_config_says_whether_blocks_are_compiled():
    from hanlm.config import load_config

    for precision, compile_blocks, expected in (
        ("bf16", None, False),
        ("fp8", None, True),  # FP8 compiles unless told not to (hanlm.train.precision)
        ("fp8", False, False),
        ("bf16", True, True),
    ):
        values = {"plan.gpu": "h200", "precision.mode": precision}
        if compile_blocks is not None:
            values["parallel.compile"] = compile_blocks
        cfg = load_config(values=values)
        assert recipe.setup_from_config(cfg, with_data=False).compiled is expected


# Measured by benchmarks/gpu_train.py on one H200 (torch 2.11.0+cu130, torchao 0.17.0; seq 2,048,
# vocab 65,536, micro-batch 16, compiled blocks, 2026-12-04): torch.cuda.max_memory_allocated.
# The rule was fitted on the 1.3b and 350m AdamW runs; 125m and Muon were measured after it.
H200_ALLOCATED_GIB = {
    ("1.3b", "bf16", "adamw"): 70.87,
    ("1.3b", "fp8", "adamw"): 53.63,
    ("350m", "bf16", "adamw"): 30.65,
    ("350m", "fp8", "adamw"): 23.00,
    ("125m", "bf16", "adamw"): 11.87,
    ("125m", "fp8", "adamw"): 9.10,
    ("1.3b", "bf16", "muon"): 66.37,
    ("1.3b", "fp8", "muon"): 49.13,
}


@pytest.mark.parametrize("preset,precision,optimizer", sorted(H200_ALLOCATED_GIB))
def test_compiled_plan_within_10_percent_of_what_an_h200_allocated(preset, precision, optimizer):
    def planned(compiled: bool) -> float:
        setup = inputs.Setup(
            model=preset, vocab_size=65536, seq_len=2048, micro_batch=16, gpu="h200",
            precision=precision, parallel="single", compiled=compiled, optimizer=optimizer,
        )  # fmt: skip
        items = memory_model.memory(setup).items
        return sum(v for k, v in items.items() if k != "framework allowance") / memory_model.GIB

    measured = H200_ALLOCATED_GIB[(preset, precision, optimizer)]
    assert abs(planned(True) / measured - 1) <= 0.10
    # the eager rule would have planned far more than a compiled run holds
    assert planned(False) / measured > 1.3


# (model overrides, seq_len, micro_batch, precision, recompute, FSDP's bf16 parameters)
ACTIVATION_CASES = [
    ({}, 128, 2, "fp32", "none", False),
    ({}, 128, 2, "bf16", "none", False),
    ({}, 128, 2, "bf16", "selective", False),
    ({}, 128, 2, "bf16", "full", False),
    ({}, 128, 2, "bf16", "none", True),
    ({"head_dim": 32, "intermediate_size": 1024}, 64, 4, "fp32", "selective", False),
    ({"num_key_value_heads": 1, "hidden_size": 384, "head_dim": 96}, 96, 2, "bf16", "full", True),
]


@pytest.mark.parametrize("overrides,seq,mb,precision,recompute,bf16_params", ACTIVATION_CASES)
def test_activation_estimate_within_15_percent_of_memtracker(
    tmp_path, overrides, seq, mb, precision, recompute, bf16_params
):
    config = LlamaConfig(
        **{**PRESETS["demo"], "num_hidden_layers": 3, **overrides},
        vocab_size=2048,
        max_position_embeddings=seq,
    )
    config_file = tmp_path / "config.json"
    config.to_json_file(config_file)
    setup = inputs.Setup(
        model=str(config_file),
        vocab_size=2048,
        seq_len=seq,
        micro_batch=mb,
        gpu="h100",
        gpus=2 if bf16_params else 1,
        parallel="fsdp" if bf16_params else "single",
        precision=precision,
        recompute=recompute,
    )
    shapes = inputs.model_shapes(setup.model, vocab_size=2048, seq_len=seq)
    measured = measure_step(
        config,
        seq_len=seq,
        micro_batch=mb,
        precision=precision,
        recompute=recompute,
        bf16_params=bf16_params,
    )
    acts = memory_model.activation_bytes(shapes, setup)
    # What the tracker sees after forward: saved activations, the gradients the loss keeps and,
    # under autocast without FSDP, the layers' bf16 weight casts kept for backward (recomputed
    # layers drop theirs; the loss frees its copy of the head within the forward).
    estimate = acts["layers"] + acts["other"] + memory_model.logits_bytes(shapes, setup)["forward"]
    if precision != "fp32" and not bf16_params and recompute == "none":
        estimate += (
            memory_model.working_copy_bytes(shapes, setup) - 2 * shapes.vocab * shapes.hidden
        )
    assert estimate == pytest.approx(measured.activations, rel=0.15)


def test_the_loss_line_counts_one_chunk_of_logits_not_the_whole(field_shapes):

    setup = replace(FIELD, micro_batch=8)  # vocab 65,536 x seq 2,048 x micro-batch 8
    line = memory_model.memory(setup, field_shapes).items["loss (chunked logits)"]
    # before hanlm.train.loss: bf16 logits plus their float32 log-softmax and gradient, 10 GiB
    before = memory_model.full_logits_bytes(field_shapes, setup)
    assert before == 10 * GIB
    assert before >= 4 * line
    smaller = replace(setup, loss_chunk_tokens=256)
    assert line - memory_model.memory(smaller, field_shapes).items["loss (chunked logits)"] == (
        12 * (1024 - 256) * 65536
    )


def _traced_loss_bytes(tokens, vocab, hidden, chunk, *, autocast, bf16_head) -> int:
    """Peak bytes of the chunked loss's forward and backward above its inputs, on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from hanlm.train.loss import TokenLoss

    dtype = torch.bfloat16 if bf16_head else torch.float32
    with FakeTensorMode():
        states = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
        head = torch.randn(vocab, hidden, dtype=dtype, requires_grad=True)
        labels = torch.zeros(tokens, dtype=torch.long)
        tracker = MemTracker()
        tracker.track_external(states, head)
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = TokenLoss(chunk).sums(states, head, labels)["loss"]
            loss.backward()
        ((by_kind,),) = [tracker.get_tracker_snapshot("peak").values()]
    return int(by_kind["Total"]) - (tokens + vocab) * hidden * dtype.itemsize  # less the inputs


@pytest.mark.parametrize(
    "precision,fsdp", [("fp32", False), ("bf16", False), ("bf16", True)], ids=str
)
def test_loss_bytes_equal_the_memory_tracker(tmp_path, precision, fsdp):
    setup = inputs.Setup(
        model="tiny", vocab_size=4096, seq_len=512, micro_batch=4, gpu="h100",
        gpus=2 if fsdp else 1, parallel="fsdp" if fsdp else "single", precision=precision,
        loss_chunk_tokens=384,
    )  # fmt: skip
    shapes = replace(inputs.model_shapes("tiny", vocab_size=4096, seq_len=512), hidden=128)
    estimate = memory_model.logits_bytes(shapes, setup)
    expected = estimate["forward"] + estimate["loss"]
    if precision == "bf16" and not fsdp:
        expected += 2 * 4096 * 128  # the head's bf16 copy: a working copy in the plan
    measured = _traced_loss_bytes(
        2048, 4096, 128, 384, autocast=precision == "bf16" and not fsdp, bf16_head=fsdp
    )
    assert expected == pytest.approx(measured, rel=0.05)


def test_step_profile_for_preflight():
    from hanlm.config import load_config

    cfg = load_config(
        values={
            "plan.gpu": "rtx5090",
            "model.preset": "125m",
            "pretrain.global_batch_tokens": 65536,
        }
    )
    profile = recipe.step_profile(cfg, world_size=4, peak_flops=209.5e12)
    assert profile["tokens_per_step"] == cfg.pretrain.global_batch_tokens
    assert profile["comm_bytes_per_gpu"] > 0 and profile["compute_s"] > 0
    params = inputs.model_shapes("125m", vocab_size=4096, seq_len=512).n_params
    assert params * 12 <= profile["checkpoint_bytes"] < params * 12 + 4096


# --- the command --------------------------------------------------------------------------------


def test_cli_field_report_as_json(cli):
    result = cli(
        "plan", "--preset", "1.3b", "--seq-len", "2048", "--micro-batch", "2",
        "--gpu", "rtx5090", "--gpus", "8", "--tokens", "22e9", "--mfu", "0.4",
        "--price-per-gpu-hour", "0.40", "--global-batch-tokens", str(1 << 20), "--json",
    )  # fmt: skip
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert out["model"]["parameters"] == 1_342_277_632
    assert out["memory"]["fits"] and out["setup"]["parallel"] == "fsdp"
    assert out["time"]["gpu_hours"] == pytest.approx(587, abs=3)


def test_cli_without_gpu_explains_the_options(cli):
    result = cli("plan", "--preset", "1.3b", "--tokens", "1e9")
    assert result.code == 0, result.err
    assert "fewest GPUs that fit" in result.err and "--gpu NAME" in result.err
    assert "rtx5090" in result.err and "h100" in result.err


def test_cli_unknown_gpu_lists_the_known_ones(cli):
    result = cli("plan", "--gpu", "rtx9090")
    assert_user_error(result, "unknown GPU 'rtx9090'", "rtx4090", "rtx5090", "b200")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpu", "a100-80gb", "--precision", "fp8"], "no FP8"),
        (["--gpu", "h100", "--mfu", "1.5"], "plan.mfu"),
        (["--gpu", "h100", "--parallel", "single", "--gpus", "2"], 'single" runs one process'),
        # the field recipe with one override: the message names the recipe's keys, not a flag
        # the user did not give
        (
            ["--config", "ko-1.3b-8x5090", "--set", "parallel.mode=single"],
            "plan.gpus x plan.hosts = 8",
        ),
        (["--preset", "7b"], "unknown model preset"),
    ],
)
def test_cli_bad_input(cli, args, needle):
    assert_user_error(cli("plan", *args), needle)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cpu_peak_is_measured_in_about_the_time_allowed(dtype):
    """A dtype without a fast CPU path (bfloat16 on AVX2: ~1 GFLOP/s, ten seconds for one
    1536-square matmul) is measured on a smaller matmul, within the time allowed."""
    import time

    from hanlm.plan import catalogue

    catalogue._cpu_peak_cache.clear()
    start = time.perf_counter()
    peak = catalogue.measured_cpu_peak_flops(getattr(torch, dtype), seconds=0.2)
    assert peak > 1e8
    assert time.perf_counter() - start < 2.0


def test_the_exact_flop_count_is_shown_with_its_sign(cli):
    """The exact count (each matmul and attention) against 6·N·D: +15% for the field model at
    2,048 tokens, -N% where it is less (an untied model's input embedding is no matmul), and a
    share that rounds to nothing as ±0% (a tiny model printed "+-0%")."""
    from hanlm.plan.table import signed_share

    assert [signed_share(x) for x in (0.151, -0.03, -0.004, 0.0, 0.004)] == [
        "+15%", "-3%", "±0%", "±0%", "±0%"
    ]  # fmt: skip
    result = cli("plan", "--gpu", "rtx5090", "--gpus", "1", "--tokens", "1e9",
                 "--set", "model.preset=tiny", "--set", "tokenizer.vocab_size=65536",
                 "--set", "pretrain.seq_len=64")  # fmt: skip
    assert result.code == 0, result.err
    assert "(±0%" in result.err and "+-" not in result.err
