"""A recipe's plan: the setup a run's config describes, its plan with the training mix and
SFT's memory per GPU, and what one optimizer step needs (for preflight).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hanlm.plan.data_rates import data_work, mixture_preview
from hanlm.plan.estimate import Plan, make_plan
from hanlm.plan.inputs import LoraPlan, Setup, model_shapes
from hanlm.plan.measured import RehearsalRecord, speaks_for
from hanlm.plan.memory_model import lora_trained, memory, model_state_bytes
from hanlm.plan.time_model import RECOMPUTE_COST, comm_bytes_per_step, default_mfu


def setup_from_config(
    cfg, *, plan_section=None, with_data: bool = True, rehearsal: RehearsalRecord | None = None
) -> Setup:
    """The Setup a run's recipe describes (pretrain model, batch, precision; plan hardware;
    with_data: the data stages' work, which sizes the local corpus inputs); with the tokens/s
    a `rehearsal` of the same shapes on the same hardware measured."""
    setup = _recipe_setup(cfg, plan_section=plan_section, with_data=with_data)
    if speaks_for(rehearsal, setup):
        where = f"hanlm rehearse on {rehearsal.device}, {rehearsal.created_at[:10]}"
        return replace(
            setup, measured_tokens_per_s=rehearsal.measured_tokens_per_s(), measured_by=where
        )
    return setup


def _recipe_setup(cfg, *, plan_section=None, with_data: bool = True) -> Setup:
    pretrain, plan = cfg.pretrain, plan_section or cfg.plan
    tokens = plan.tokens
    if tokens is None:
        if pretrain.max_tokens is not None:
            tokens = pretrain.max_tokens
        elif pretrain.max_steps is not None:
            tokens = pretrain.max_steps * pretrain.global_batch_tokens
    parallel = planned_parallel(cfg.parallel.mode, plan.gpus * plan.hosts)
    precision = "fp8" if cfg.precision.mode == "fp8-emulate" else cfg.precision.mode
    model, vocab_size = cfg.model.preset, cfg.tokenizer.vocab_size
    if cfg.model.init_from:  # continued pretraining: the model's own, with the tokens added
        # deferred: hanlm.model_folder imports safetensors, which a plan does without
        from hanlm.model_folder import check_model_folder, vocab_rows

        base = check_model_folder(cfg.model.init_from)
        # spare rows may take some added tokens: at most this many
        model, vocab_size = str(base), vocab_rows(base) + cfg.tokenizer.extend
    return Setup(
        model=model,
        vocab_size=vocab_size,
        seq_len=pretrain.seq_len,
        micro_batch=pretrain.micro_batch,
        gpu=plan.gpu,
        gpus=plan.gpus,
        hosts=plan.hosts,
        precision=precision,
        parallel=parallel,
        recompute=cfg.parallel.activation_checkpointing,
        compiled=blocks_compile(precision, cfg.parallel.compile),
        optimizer=cfg.optimizer.name,
        tokens=tokens,
        global_batch_tokens=pretrain.global_batch_tokens,
        price_per_gpu_hour=plan.price_per_gpu_hour,
        mfu=plan.mfu,
        inter_host_gbps=plan.inter_host_gbps,
        data=data_work(cfg, tokens, plan) if with_data else None,
        loss_chunk_tokens=cfg.parallel.loss_chunk_tokens,
        async_checkpoint=cfg.checkpoint.async_save,
    )


def planned_parallel(mode: str, world: int) -> str:
    """parallel.mode as training resolves it on `world` devices (auto: FSDP2 over several)."""
    if mode == "auto" or (mode == "ddp" and world == 1):
        return "single" if world == 1 else "fsdp"
    return mode


def blocks_compile(precision: str, requested: bool | None) -> bool:
    """Whether a run compiles its decoder blocks: as set, or when unset with FP8 (FP8 is fast
    only compiled; hanlm.train.precision.compile_choice says why to the user)."""
    return precision == "fp8" if requested is None else requested


def step_profile(
    cfg, *, world_size: int, peak_flops: float, mfu: float | None = None
) -> dict[str, Any]:
    """What one optimizer step of the run's recipe needs on `world_size` devices: for preflight."""
    setup = replace(setup_from_config(cfg, with_data=False), gpus=world_size, hosts=1)
    if setup.parallel == "single" and world_size > 1:
        setup = replace(setup, parallel="fsdp")
    shapes = model_shapes(setup.model, vocab_size=setup.vocab_size, seq_len=setup.seq_len)
    tokens_per_micro = setup.seq_len * setup.micro_batch * world_size
    accumulation = max(1, math.ceil((setup.global_batch_tokens or 0) / tokens_per_micro))
    tokens_per_step = accumulation * tokens_per_micro
    mfu = mfu or default_mfu(setup.gpu, setup.precision)[0]
    compute_s = (
        tokens_per_step
        * shapes.flops["six_n"]
        * RECOMPUTE_COST[setup.recompute]
        / (world_size * peak_flops * mfu)
    )
    state = model_state_bytes(shapes, 1, "single", optimizer=setup.optimizer)
    return {
        "tokens_per_step": tokens_per_step,
        "compute_s": compute_s,
        "comm_bytes_per_gpu": comm_bytes_per_step(shapes, setup, accumulation),
        "checkpoint_bytes": state["weights"] + state["optimizer"],
        "tokens_per_s_needed": tokens_per_step / compute_s,
    }


def plan_recipe(cfg, *, plan_section=None, rehearsal: RehearsalRecord | None = None) -> Plan:
    """The plan of a recipe: its setup's (make_plan), and its training mix's preview when its
    corpus sources have weights; a `rehearsal` of its shapes on its hardware gives its speed."""
    setup = setup_from_config(cfg, plan_section=plan_section, rehearsal=rehearsal)
    plan = make_plan(setup)
    update: dict[str, Any] = {"mixture": mixture_preview(cfg)}
    if setup.gpu is not None:
        update["sft"] = sft_memory(cfg, setup)
    return plan.model_copy(update=update)


# the chat template's tokens whose rows LoRA trains by default (hanlm.chat.tokens.TEMPLATE_TOKENS)
CHAT_TOKEN_ROWS = 4


def sft_memory(cfg, setup: Setup) -> dict[str, Any]:
    """SFT's memory per GPU on the plan's hardware, at sft.seq_len and sft.micro_batch: full
    fine-tuning (every weight with its gradient and AdamW state) beside LoRA (sft.lora: the
    weights frozen, the adapters and the chat tokens' rows trained)."""
    lora = cfg.sft.lora
    base = replace(setup, seq_len=cfg.sft.seq_len, micro_batch=cfg.sft.micro_batch)
    shapes = model_shapes(base.model, vocab_size=base.vocab_size, seq_len=base.seq_len)
    plan = LoraPlan(lora.rank, tuple(lora.target_modules), CHAT_TOKEN_ROWS)
    trained, _ = lora_trained(shapes, plan)
    # FP8 converts the linear layers LoRA wraps (SFT refuses the pair): LoRA runs in bf16
    lora_precision = "bf16" if base.precision == "fp8" else base.precision
    return {
        "seq_len": base.seq_len,
        "micro_batch": base.micro_batch,
        "method": cfg.sft.method,
        "lora_rank": lora.rank,
        "lora_targets": list(lora.target_modules),
        "lora_trained_parameters": trained,
        "precision": base.precision,
        "lora_precision": lora_precision,
        "full": memory(base, shapes).model_dump(exclude_unset=True),
        "lora": memory(
            replace(
                base,
                lora=plan,
                precision=lora_precision,
                compiled=blocks_compile(lora_precision, cfg.parallel.compile),
            ),
            shapes,
        ).model_dump(exclude_unset=True),
    }
