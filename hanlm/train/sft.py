"""One chat fine-tuning: the source model placed and trained on the chat rows, and its export.

The field report's trap: pretraining never saw the chat template's special tokens, their rows
stayed untrained, and after SFT the model closed 0 of 50 answers (49 of 50 once initialised).
One SFT training here:

1. the source model: the run's latest pretraining checkpoint (else DIR/pretrain/hf), or
   `sft.model` (a Hugging Face folder), built on the meta device, placed as in pretraining
   (sharded under FSDP2) and read in by parts, each rank reading only the rows it keeps
   (hanlm.train.pretrained): no rank holds a whole copy;
2. the untrained template tokens initialised (`sft.init`) on the placed model, as one process
   would (hanlm.chat.tokens), their rows trainable, optionally with their own step size;
3. the pretraining loop (Trainer) on assistant tokens only, each turn's end token included,
   with checkpoints and resume, in the run's precision as pretraining (fp8: the loaded model's
   large linear layers become Float8Linear, the blocks compiled; see hanlm.train.precision);
4. the export with generation_config.eos_token_id = [end of turn, end of text].

`sft.method = "lora"` trains PEFT's LoRA adapters instead of every weight (hanlm.train.lora),
with the template tokens' embedding rows trained alone unless `sft.train_new_token_rows` is
false; the export merges them into a plain model and keeps the adapter beside it. The data
(hanlm.train.sft_data), the audit and the closure check (hanlm.train.sft_checks) are their own
modules; the sft stage runs the variants (`sft.compare`) and writes their results.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hanlm import inference, model_init
from hanlm import model as model_lib
from hanlm.chat import tokens
from hanlm.config import Config, SftSection, SftVariant
from hanlm.console import info, warn
from hanlm.data import chat_data
from hanlm.errors import UserError
from hanlm.files import fingerprint
from hanlm.train import (
    build,
    checkpoint_layout,
    document_attention,
    export,
    lora,
    parallel,
    precision,
    pretrained,
)
from hanlm.train.results import TokenAudit


class SftOutputs(Protocol):
    """Where one SFT training writes (hanlm.stages.rundir.SftDirs is one)."""

    checkpoints: Path
    metrics: Path
    export: Path
    place: str  # its checkpoints' folder under [checkpoint] mirror


@dataclass(frozen=True)
class SftSource:
    """Where SFT starts: a pretraining checkpoint (with the model config to build for it) or a
    Hugging Face folder; `fingerprint` says which state of it."""

    kind: str  # "checkpoint" or "hf"
    path: Path
    tokenizer_dir: Path
    fingerprint: str
    pretrain_counts: dict[str, int] | None = None  # special-token counts of its pretraining data
    model_config: object | None = None  # kind checkpoint: the PretrainedConfig to load it into
    # tokens hanlm added to its vocabulary (hanlm.chat.template_base): untrained by construction
    added_tokens: tuple[str, ...] = ()


# --- the source model -----------------------------------------------------------------------------


def _check_checkpoint(source: SftSource) -> None:
    if source.kind != "checkpoint":
        return
    problem = checkpoint_layout.verify(source.path)  # its files against its manifest
    if problem:
        raise UserError(
            f"the pretraining checkpoint {source.path} is damaged: {problem}",
            fix="move that step folder away (SFT then starts from the previous committed "
            "checkpoint), or pretrain again",
        )


def load_source_model(source: SftSource):
    """(CPU model in train mode, its config): the whole model, on this process."""
    if source.kind == "hf":
        model = export.load_exported(source.path)
        return model.float().train(), model.config
    _check_checkpoint(source)
    model = export.load_checkpoint_model(source.path, source.model_config)
    return model.train(), source.model_config


def model_on_meta(source: SftSource):
    """(the source's model built on the meta device from its config, why its weights cannot be
    read into it part by part or None): see hanlm.train.pretrained."""
    _check_checkpoint(source)
    if source.kind == "hf":
        config = inference.read_config(source.path)
    else:  # a copy: building sets the attention implementation in the config
        config = copy.deepcopy(source.model_config)
    model = model_lib.build_model(config, device="meta")
    problem = pretrained.mismatch(model, source.kind, source.path)
    if problem is None:
        try:
            model_init.buffer_owners(model)
        except ValueError as e:
            problem = str(e)
    return model, problem


# --- one training -----------------------------------------------------------------------------------


def _accumulation(sft_cfg: SftSection, world_size: int) -> int:
    per_pass = sft_cfg.micro_batch * world_size
    if sft_cfg.batch_rows % per_pass:
        raise UserError(
            f"sft.batch_rows {sft_cfg.batch_rows} is not a multiple of micro_batch x ranks = {per_pass}",
            fix=f"use --set sft.batch_rows={max(per_pass, sft_cfg.batch_rows // per_pass * per_pass)}",
        )
    return sft_cfg.batch_rows // per_pass


def initialise_rows(
    cfg: Config, model, source: SftSource, audit: TokenAudit, special: dict, init: str
):
    """(the ids of the untrained template rows, what initialising them did) on the placed
    model: every rank computes the rows one process would, and writes those it holds."""
    ids = [special[n]["id"] for n in audit.untrained_template_tokens]
    text_ids = None
    if init == "text":
        text_ids = inference.load_tokenizer(source.tokenizer_dir).encode(
            cfg.sft.init_text, add_special_tokens=False
        )
    done = tokens.initialise(
        parallel.unwrap(model), ids, init, special, text_ids=text_ids, seed=cfg.run.seed
    )
    return ids, done


def _chat_loaders(rows: dict, seed: int, micro_batch: int, dist: parallel.Dist):
    common = {"micro_batch": micro_batch, "rank": dist.rank, "world_size": dist.world_size}
    train_loader = chat_data.ChatLoader(*rows["train"], seed=seed, **common)
    try:
        val_loader = chat_data.ChatLoader(*rows["heldout"], shuffle=False, **common)
    except UserError:
        val_loader = None
    return train_loader, val_loader


def _row_step_scale(sft_cfg: SftSection, model, ids: list[int], init: str):
    """The optimizer hook giving the initialised rows their own step size, when asked for."""
    if sft_cfg.new_token_lr_scale == 1.0 or not ids or init == "none":
        return None
    # under FSDP2 each rank stretches the rows of its own shard (tokens.local_rows)
    return lambda optimizer: tokens.RowStepScale(
        optimizer, parallel.unwrap(model), ids, sft_cfg.new_token_lr_scale
    )


def _placed_model(
    cfg: Config, source: SftSource, numerics: precision.Numerics, dist: parallel.Dist, mode: str
):
    """(the source model placed as in pretraining: converted to FP8 where the plan says,
    compiled and parallelised; its config; the names of the converted layers). Built on the
    meta device and filled from the source where it can be, each rank reading only what it
    keeps; else loaded whole on every rank. Before the optimizer is built: FP8's FSDP
    all-gather wraps the weights anew."""
    par = cfg.parallel
    converted: list[str] = []

    def to_fp8(module) -> None:
        converted[:] = precision.apply_fp8(
            module, numerics, fsdp_float8_all_gather=par.fsdp_float8_all_gather
        )

    options = {
        "compute_dtype": numerics.compute_dtype,
        "compile_blocks": precision.blocks_compiled(numerics, par.compile, announce=dist.is_main),
        "convert": to_fp8,
    }
    model, problem = model_on_meta(source)
    if problem is not None:
        if dist.is_main:
            warn(f"sft: every rank loads the whole source model ({source.path}: {problem})")
        model, _ = load_source_model(source)
    if cfg.sft.packing:  # packed conversations must not see each other
        document_attention.prepare(
            model, dist.device, par.document_attention, setting="sft.packing"
        )
    if problem is not None:
        return parallel.parallelize_whole(model, dist, mode, **options), model.config, converted

    def fill(placed) -> None:
        pretrained.fill(placed, source.kind, source.path)

    root = parallel.parallelize_loaded(model, dist, mode, fill=fill, **options)
    return root, model.config, converted


def adapters_of(cfg: Config, variant: SftVariant, special: dict) -> lora.Adapters | None:
    """LoRA's adapters for `variant` (None: full fine-tuning): the chat template tokens' rows
    trained besides, unless the variant freezes them."""
    if variant.method != "lora":
        return None
    rows = ()
    if variant.train_new_token_rows:
        rows = tuple(special[n]["id"] for n in tokens.TEMPLATE_TOKENS if n in special)
    return lora.Adapters(cfg.sft.lora, rows)


def _placed_lora_model(
    cfg: Config,
    source: SftSource,
    numerics: precision.Numerics,
    dist: parallel.Dist,
    mode: str,
    adapters: lora.Adapters,
    initialise,
):
    """(the source model with LoRA's adapters, placed; its config; the frozen parameters held
    in the compute dtype): loaded whole on every rank (PEFT injects into a materialised model),
    its untrained rows initialised first (PEFT keeps a trained row's starting value from the
    model it wraps), then injected, its frozen linear layers stored in the compute dtype, and
    parallelized (under FSDP2 each block sharded with its frozen weights and adapters
    together)."""
    model, config = load_source_model(source)
    initialise(model)
    _, injected = adapters.inject(model, seed=cfg.run.seed)
    held = lora.hold_frozen_linears(injected, numerics.compute_dtype)
    if cfg.sft.packing:
        document_attention.prepare(
            injected, dist.device, cfg.parallel.document_attention, setting="sft.packing"
        )
    compile_blocks = precision.blocks_compiled(
        numerics, cfg.parallel.compile, announce=dist.is_main
    )
    root = parallel.parallelize_whole(
        injected,
        dist,
        mode,
        compute_dtype=numerics.compute_dtype,
        compile_blocks=compile_blocks,
    )
    return root, config, held


@dataclass(frozen=True)
class TrainedOnce:
    """One SFT training: the trainer's summary, the model config it built, and whether this
    process is rank 0 (the one that exports and checks)."""

    summary: dict
    config: Any
    is_main: bool


def train_once(
    cfg: Config,
    *,
    source: SftSource,
    outputs: SftOutputs,
    audit: TokenAudit,
    special: dict,
    rows: dict,
    variant: SftVariant,
    data_fp: str,
    settings_fp: str,
    force: bool,
) -> TrainedOnce:
    """Initialise, train and checkpoint one SFT variant into `outputs` (the weights are in its
    latest checkpoint)."""
    sft_cfg, init = cfg.sft, variant.init
    adapters = adapters_of(cfg, variant, special)
    with build.processes(cfg.parallel.device, cfg.parallel.timeout_s) as dist:
        numerics = precision.resolve(
            cfg.precision.mode, dist.device, recipe=cfg.precision.fp8_recipe
        )
        mode = parallel.resolve_mode(cfg.parallel.mode, dist)
        accumulation = _accumulation(sft_cfg, dist.world_size)
        if force or sft_cfg.checkpoint.resume == "never":
            build.start_fresh(dist, [outputs.checkpoints, outputs.metrics])
        if adapters is None:
            model, mconfig, converted = _placed_model(cfg, source, numerics, dist, mode)
            ids, done = initialise_rows(cfg, model, source, audit, special, init)
            held = 0
        else:
            initialised: dict = {}

            def initialise(plain) -> None:
                initialised["ids"], initialised["done"] = initialise_rows(
                    cfg, plain, source, audit, special, init
                )

            model, mconfig, held = _placed_lora_model(
                cfg, source, numerics, dist, mode, adapters, initialise
            )
            ids, done, converted = initialised["ids"], initialised["done"], []

        def after_step() -> None:
            precision.precompute_fp8_scales_if_needed(
                model, numerics, cfg.parallel.fsdp_float8_all_gather
            )

        train_loader, val_loader = _chat_loaders(rows, cfg.run.seed, sft_cfg.micro_batch, dist)
        job = build.TrainingJob(
            total_steps=sft_cfg.max_steps,
            accumulation=accumulation,
            train_loader=train_loader,
            val_loader=val_loader,
            checkpoints_dir=outputs.checkpoints,
            checkpoints_place=outputs.place,
            metrics_path=outputs.metrics,
            flops_per_token=model_lib.flops_per_token(mconfig, sft_cfg.seq_len)["total"],
            fingerprint=fingerprint(
                "sft-model",
                source.fingerprint,
                data_fp,
                cfg.run.seed,
                init,
                variant.name,
                None if adapters is None else adapters.section.model_dump(),
            ),
            settings=settings_fp,
            student_tokenizer=Path(source.tokenizer_dir),
            # LoRA's trained rows are PEFT's parameters, stepped by the schedule alone
            configure_optimizer=None if adapters else _row_step_scale(sft_cfg, model, ids, init),
            after_optimizer_step=after_step,
        )
        trainer = build.build_trainer(
            model, job, build.Placement(dist, mode, numerics), build.Components.sft(cfg)
        )
        resumed = sft_cfg.checkpoint.resume == "auto" and not force and trainer.resume()
        if dist.is_main:
            trained, total = lora.trainable_counts(parallel.unwrap(model))
            info(
                f"sft ({variant.name}): {trained:,} of {total:,} parameters trained; "
                f"{sft_cfg.max_steps} steps of {sft_cfg.batch_rows} rows x {sft_cfg.seq_len} tokens; "
                f"{train_loader.rows} rows, {train_loader.trained_tokens:,} trained tokens; "
                f"{precision.describe(numerics)}; fp8 layers: {len(converted)}"
                + (
                    f"; {held:,} frozen parameters held in "
                    f"{precision.dtype_name(numerics.compute_dtype)}"
                    if held
                    else ""
                )
                + ("; resumed" if resumed else "")
            )
        result = trainer.fit()
        parallel.barrier(dist)
        return TrainedOnce(summary={**result, "init": done}, config=mconfig, is_main=dist.is_main)


def trained_model(checkpoint_dir: Path, config, adapters: lora.Adapters | None):
    """The plain CPU model a variant's checkpoint holds (LoRA's adapters merged in)."""
    if adapters is None:
        return export.load_checkpoint_model(checkpoint_dir, config)
    peft_model = export.load_checkpoint_adapters(checkpoint_dir, config, adapters)
    return adapters.merged(peft_model)


def export_trained(
    outputs: SftOutputs,
    config,
    tokenizer_dir: Path,
    eos_ids: list[int],
    adapters: lora.Adapters | None,
) -> None:
    """The latest checkpoint of `outputs` as a Hugging Face folder, ending answers with
    `eos_ids` (LoRA's adapters merged in, the adapter kept beside)."""
    latest = checkpoint_layout.latest(outputs.checkpoints)
    export.export_checkpoint(
        latest,
        outputs.export,
        model_config=config,
        tokenizer_dir=tokenizer_dir,
        eos_token_ids=eos_ids,
        adapters=adapters,
    )
    merged = "" if adapters is None else f"; LoRA merged, the adapter in {export.ADAPTER_FOLDER}/"
    ends = ", ".join(inference.load_tokenizer(tokenizer_dir).convert_ids_to_tokens(eos_ids))
    info(f"sft: exported {latest.name} -> {outputs.export} (eos: {ends}{merged})")
