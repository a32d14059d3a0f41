"""Chat fine-tuning whose answers end (the stage, hanlm.stages.sft, gives it its inputs).

The field report's trap: pretraining never saw the chat template's special tokens, their rows
stayed untrained, and after SFT the model closed 0 of 50 answers (49 of 50 once initialised).
This stage makes it impossible to miss:

1. the source model: the run's latest pretraining checkpoint (else DIR/pretrain/hf), or
   `sft.model` (`--model HF_DIR`, a hanlm export), built on the meta device, placed as in
   pretraining (sharded under FSDP2) and read in by parts, each rank reading only the rows it
   keeps (hanlm.train.pretrained): no rank holds a whole copy;
2. the data (`sft.data`, default DIR/demo/chat.jsonl) read and checked, conversations holding
   benchmark items dropped or refused (the run's decontam index), N held out (seeded);
3. the special-token audit (hanlm.chat.tokens) -> audit.json and a table;
4. the untrained template tokens initialised (`sft.init`) on the placed model, as one process
   would (hanlm.chat.tokens), their rows trainable, optionally with their own step size;
5. the pretraining loop (Trainer) on assistant tokens only, each turn's <|eot|> included,
   with checkpoints and resume in DIR/sft/checkpoints, in the run's precision as pretraining
   (fp8: the loaded model's large linear layers become Float8Linear, the blocks compiled; see
   hanlm.train.precision);
6. export to DIR/sft/hf with generation_config.eos_token_id = [end of turn, end of text];
7. the closure check on the held-out prompts -> closure.json, and the `sft.min_closure` gate;
   beside it, why answers end or not: the template rows' norms against the trained rows', and
   the rank of <|eot|>'s logit where the held-out reference answers end, both before SFT (after
   the initialisation) and after it;
8. `sft.compare`: the same SFT in other variants (init, full or LoRA, the template rows trained
   or frozen) into DIR/sft/ablation/<variant>/, summed up in closure_by_variant.json.

`sft.method = "lora"` trains PEFT's LoRA adapters instead of every weight (hanlm.train.lora),
with the template tokens' embedding rows trained alone unless `sft.train_new_token_rows` is
false; the export merges them into a plain model and keeps the adapter beside it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hanlm import inference, model_init
from hanlm import model as model_lib
from hanlm.chat import closure, tokens
from hanlm.config import Config, SftSection, SftVariant
from hanlm.console import info, warn
from hanlm.data import chat_data
from hanlm.data.chat_sources import REPEAT
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, fingerprint, read_json
from hanlm.plan.catalogue import device_peak_flops
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
from hanlm.train.results import SftSummary

if TYPE_CHECKING:
    from hanlm.data.decontam.index import BenchmarkIndex

HELDOUT_SEED = 8  # a stream of its own: the split does not move when other settings do


class SftOutputs(Protocol):
    """Where one SFT writes (hanlm.stages.rundir.SftDirs is one)."""

    root: Path
    checkpoints: Path
    metrics: Path
    export: Path
    audit: Path
    data_report: Path
    closure: Path
    closure_by_variant: Path
    summary: Path

    def ablation(self, variant: str) -> SftOutputs: ...


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


def _model_on_meta(source: SftSource):
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


# --- data -----------------------------------------------------------------------------------------


def decontaminate(conversations: list[dict], index: BenchmarkIndex | None, sft_cfg: SftSection):
    """(kept conversations, report): those holding an item of the run's benchmark index (its
    decontam stage's) are dropped or refused."""
    if index is None:
        return conversations, {"checked": False, "reason": "the run has no decontam index"}
    kept, dropped = [], []
    for conversation in conversations:
        text = chat_data.conversation_text(conversation["messages"])
        hits = index.matches(text, min_coverage=sft_cfg.contamination_coverage)
        if hits:
            dropped.append({"id": conversation["id"], "items": hits})
        else:
            kept.append(conversation)
    if dropped and sft_cfg.contaminated == "fail":
        first = dropped[0]
        raise UserError(
            f"{len(dropped)} SFT conversations hold benchmark items (first: {first['id']} holds "
            f"{first['items'][0]['benchmark']} item {first['items'][0]['item_id']})",
            fix="remove them from the data, or set sft.contaminated = drop to drop them",
        )
    if dropped:
        warn(f"sft: dropped {len(dropped)} conversations holding benchmark items")
    return kept, {"checked": True, "dropped": len(dropped), "conversations": dropped}


def split_heldout(conversations: list[dict], count: int, seed: int) -> tuple[list, list]:
    """(train, held out): `count` conversations held out for the closure check, and every
    repeat of them (a mix's `ID#repeat2`, ...) out of training too: it never saw what it is asked."""
    base = [c["id"].split(REPEAT, 1)[0] for c in conversations]
    distinct = list(dict.fromkeys(base))
    if len(distinct) < 2:
        raise UserError(
            f"SFT needs at least 2 conversations, the data has {len(distinct)}",
            fix="give more conversations",
        )
    count = min(count, len(distinct) // 2)
    order = np.random.default_rng([seed, HELDOUT_SEED]).permutation(len(distinct))
    held = {distinct[i] for i in order[:count].tolist()}
    train = [c for c, b in zip(conversations, base, strict=True) if b not in held]
    heldout = [c for c, b in zip(conversations, base, strict=True) if b in held and b == c["id"]]
    return train, heldout


def load_tokenizer(tokenizer_dir: Path):
    """The checked tokenizer folder's tokenizer (hanlm.inference), which must carry a chat
    template."""
    tok = inference.load_tokenizer(tokenizer_dir)
    if not tok.chat_template:
        raise UserError(
            f"the tokenizer in {tokenizer_dir} has no chat template",
            fix="use a hanlm tokenizer (its tokenizer_config.json carries the template)",
        )
    return tok


def _rows(tokenizer, train, heldout, sft_cfg: SftSection, eot: int, pad: int):
    def encode(conversations):
        return [chat_data.tokenize(tokenizer, c["messages"], eot) for c in conversations]

    train_ids, train_mask, train_positions, too_long = chat_data.build_rows(
        encode(train), sft_cfg.seq_len, pad, packing=sft_cfg.packing
    )
    held_encoded = encode(heldout)
    held_ids, held_mask, held_positions, held_too_long = chat_data.build_rows(
        held_encoded, sft_cfg.seq_len, pad, packing=sft_cfg.packing
    )
    # The closure check asks only what the model could have learned: conversations that fit.
    fitting = [
        c
        for c, (ids, _) in zip(heldout, held_encoded, strict=True)
        if len(ids) <= sft_cfg.seq_len + 1
    ]
    if len(train_ids) == 0:
        raise UserError(
            f"every training conversation is longer than sft.seq_len + 1 = {sft_cfg.seq_len + 1} tokens",
            fix="raise sft.seq_len",
        )
    report = {
        "conversations": len(train) + len(heldout),
        "train_conversations": len(train),
        "heldout_conversations": len(heldout),
        "too_long_dropped": too_long + held_too_long,
        "train_rows": len(train_ids),
        "trained_tokens": int(train_mask[:, 1:].sum()),
        "packing": sft_cfg.packing,
    }
    if too_long:
        warn(
            f"sft: {too_long} conversations longer than {sft_cfg.seq_len + 1} tokens were left out"
        )
    if not fitting:
        raise UserError(
            f"no held-out conversation fits sft.seq_len + 1 = {sft_cfg.seq_len + 1} tokens",
            fix="raise sft.seq_len or sft.heldout",
        )
    report["closure_prompts"] = len(fitting)
    rows = {
        "train": (train_ids, train_mask, train_positions),
        "heldout": (held_ids, held_mask, held_positions),
    }
    return rows, report, fitting


# --- one training -----------------------------------------------------------------------------------


def _accumulation(sft_cfg: SftSection, world_size: int) -> int:
    per_pass = sft_cfg.micro_batch * world_size
    if sft_cfg.batch_rows % per_pass:
        raise UserError(
            f"sft.batch_rows {sft_cfg.batch_rows} is not a multiple of micro_batch x ranks = {per_pass}",
            fix=f"use --set sft.batch_rows={max(per_pass, sft_cfg.batch_rows // per_pass * per_pass)}",
        )
    return sft_cfg.batch_rows // per_pass


def _initialise_rows(cfg: Config, model, source: SftSource, audit: dict, special: dict, init: str):
    """(the ids of the untrained template rows, what initialising them did) on the placed
    model: every rank computes the rows one process would, and writes those it holds."""
    ids = [special[n]["id"] for n in audit["untrained_template_tokens"]]
    text_ids = None
    if init == "text":
        text_ids = load_tokenizer(source.tokenizer_dir).encode(
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
    model, problem = _model_on_meta(source)
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
    audit: dict,
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
            ids, done = _initialise_rows(cfg, model, source, audit, special, init)
            held = 0
        else:
            initialised: dict = {}

            def initialise(plain) -> None:
                initialised["ids"], initialised["done"] = _initialise_rows(
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
            metrics_path=outputs.metrics,
            flops_per_token=model_lib.flops_per_token(mconfig, sft_cfg.seq_len)["total"],
            peak_flops=device_peak_flops(dist.device, numerics.name)[0],
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


# --- the whole fine-tuning --------------------------------------------------------------------------


def _audit(source: SftSource, special: dict) -> dict:
    model, problem = _model_on_meta(source)
    if problem is None:  # the audit reads the token matrices only
        model = pretrained.with_token_matrices(model, source.kind, source.path)
    else:
        model, _ = load_source_model(source)
    audit = tokens.audit(model, special, source.pretrain_counts, added=source.added_tokens)
    audit["source"] = str(source.path)
    del model
    tokens.print_audit(audit)
    return audit


def _export(
    outputs: SftOutputs,
    config,
    tokenizer_dir: Path,
    eos_ids: list[int],
    adapters: lora.Adapters | None,
) -> None:
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
    ends = ", ".join(load_tokenizer(tokenizer_dir).convert_ids_to_tokens(eos_ids))
    info(f"sft: exported {latest.name} -> {outputs.export} (eos: {ends}{merged})")


def _diagnosis(model, tokenizer, heldout: list, special: dict) -> dict:
    """The template rows' norms and <|eot|>'s rank at the held-out answers' ends, for `model`."""
    eot = special["eot"]["id"]
    examples = [chat_data.tokenize(tokenizer, c["messages"], eot) for c in heldout]
    return {
        "row_norms": tokens.row_norms(model, special),
        "eot_rank": closure.end_of_answer_ranks(model, examples, end_of_turn_id=eot),
    }


def _before_sft(cfg: Config, source: SftSource, audit: dict, special: dict, init: str, heldout):
    """The diagnosis of the source model as SFT starts it: initialised by `init`."""
    model, _ = load_source_model(source)
    _initialise_rows(cfg, model, source, audit, special, init)
    tokenizer = load_tokenizer(source.tokenizer_dir)
    return _diagnosis(model, tokenizer, heldout, special)


def _closure(
    model,
    tokenizer,
    heldout: list,
    special: dict,
    sft_cfg: SftSection,
    variant: SftVariant,
    path: Path,
    before: dict,
):
    check = closure.check(
        model,
        tokenizer,
        heldout,
        end_of_turn_id=special["eot"]["id"],
        pad_id=special["pad"]["id"],
        max_new_tokens=sft_cfg.closure_max_tokens,
        init=variant.init,
    )
    check.update({"variant": variant.name, "method": variant.method})
    if variant.method == "lora":
        check["rows_trained"] = variant.train_new_token_rows
    check["diagnosis"] = {"before": before, "after": _diagnosis(model, tokenizer, heldout, special)}
    atomic_write_json(path, check)
    return check


def check_lora(cfg: Config, source: SftSource) -> None:
    """LoRA's settings against the source model and the precision, before any work."""
    variants = cfg.sft.variants()
    if not any(v.method == "lora" for v in variants):
        return
    if cfg.precision.mode in ("fp8", "fp8-emulate"):
        raise UserError(
            f"sft.method lora with precision.mode {cfg.precision.mode}: FP8 converts the linear "
            "layers LoRA wraps",
            fix="set precision.mode = bf16 (or fp32) for LoRA SFT",
        )
    model, _ = _model_on_meta(source)
    lora.check_targets(model, cfg.sft.lora)


def _guard_untrained_rows(variants: list[SftVariant], audit: dict) -> None:
    """The field's failure, caught: the template tokens are untrained and a variant will neither
    initialise nor train their rows (LoRA, rows frozen, init none). The SFT's own variant is
    refused; a compared one (a deliberate ablation) is warned about."""
    untrained = audit["untrained_template_tokens"]
    if not untrained:
        return
    names = ", ".join(untrained)
    fix = (
        "set sft.train_new_token_rows = true (LoRA then trains those rows alone) or sft.init = "
        "mean (they start where trained rows are)"
    )
    for position, variant in enumerate(variants):
        if variant.method != "lora" or variant.train_new_token_rows:
            continue
        if variant.rows_stay_untrained:
            what = (
                f"sft variant {variant.name}: the template tokens {names} were never trained, "
                "LoRA freezes their embedding rows and init none leaves them as pretraining did: "
                "the field's setup, where 0 of 50 answers ended"
            )
            if position == 0:
                raise UserError(what, fix=fix)
            warn(f"{what} (a compared variant: kept, to show it)")
        else:
            warn(
                f"sft variant {variant.name}: the template tokens {names} start initialised "
                f"({variant.init}) but LoRA freezes their rows: they never learn; "
                "sft.train_new_token_rows = true trains them"
            )


def fine_tune(
    cfg: Config,
    *,
    source: SftSource,
    conversations: list[dict],
    sources: dict[str, dict],
    data_fp: str,
    index: BenchmarkIndex | None,
    outputs: SftOutputs,
    settings_fp: str,
    force: bool,
) -> SftSummary:
    """Audit, initialise, train, export and check closure (and the compared variants); the
    summary, which rank 0 also writes (with the closure: the other ranks write nothing and know
    only the training's part). A closure below sft.min_closure is a UserError after the summary
    is written."""
    sft_cfg = cfg.sft
    variants = sft_cfg.variants()
    main = variants[0]
    check_lora(cfg, source)
    conversations, contamination = decontaminate(conversations, index, sft_cfg)
    train_conversations, heldout = split_heldout(conversations, sft_cfg.heldout, cfg.run.seed)
    tokenizer = load_tokenizer(source.tokenizer_dir)
    special = tokens.load_special_tokens(source.tokenizer_dir)
    eot, pad, eod = (special[k]["id"] for k in ("eot", "pad", "eod"))
    rows, data_report, heldout = _rows(tokenizer, train_conversations, heldout, sft_cfg, eot, pad)
    data_report.update({"sources": sources, "fingerprint": data_fp, "contamination": contamination})
    audit = _audit(source, special)
    _guard_untrained_rows(variants, audit)  # refused: nothing written
    atomic_write_json(outputs.audit, audit)
    atomic_write_json(outputs.data_report, data_report)

    common = {
        "source": source,
        "audit": audit,
        "special": special,
        "rows": rows,
        "data_fp": data_fp,
        "settings_fp": settings_fp,
        "force": force,
    }
    trained = train_once(cfg, outputs=outputs, variant=main, **common)
    result, is_main = trained.summary, trained.is_main
    before = {}
    if is_main:  # LoRA starts as the initialised source model: its adapters add zero
        for init in dict.fromkeys(v.init for v in variants):
            before[init] = _before_sft(cfg, source, audit, special, init, heldout)
    summary: dict = {
        "init": main.init,
        "method": main.method,
        "step": result["step"],
        "tokens": result["tokens"],
    }
    if "val_loss" in result:
        summary["val_loss"] = result["val_loss"]
    by_variant: dict[str, float] = {}
    if is_main:
        _export(
            outputs,
            trained.config,
            source.tokenizer_dir,
            [eot, eod],
            adapters_of(cfg, main, special),
        )
        model = export.load_exported(outputs.export)
        exported_tokenizer = load_tokenizer(outputs.export)
        check = _closure(
            model,
            exported_tokenizer,
            heldout,
            special,
            sft_cfg,
            main,
            outputs.closure,
            before[main.init],
        )
        by_variant[main.name] = check["rate"]
        info(f"sft: closure {check['closed']}/{check['total']} ({check['rate']:.2f}) ({main.name})")
    for other in variants[1:]:
        folder = outputs.ablation(other.name)
        ablation = train_once(cfg, outputs=folder, variant=other, **common)
        if is_main:
            latest = checkpoint_layout.latest(folder.checkpoints)
            model = trained_model(latest, ablation.config, adapters_of(cfg, other, special))
            check = _closure(
                model,
                tokenizer,
                heldout,
                special,
                sft_cfg,
                other,
                folder.closure,
                before[other.init],
            )
            by_variant[other.name] = check["rate"]
            info(f"sft: ablation closure {check['closed']}/{check['total']} ({other.name})")
    if not is_main:
        return SftSummary.model_validate(summary)
    atomic_write_json(outputs.closure_by_variant, by_variant)
    main_check = read_json(outputs.closure)
    summary.update(
        {
            "closure": {k: main_check[k] for k in ("closed", "total", "rate")},
            "closure_by_variant": by_variant,
            "untrained_template_tokens": audit["untrained_template_tokens"],
            "hf": str(outputs.export),
            "data": {k: v for k, v in data_report.items() if k != "contamination"},
            "contaminated_dropped": contamination.get("dropped", 0),
        }
    )
    typed = SftSummary.model_validate(summary)
    typed.write(outputs.summary)
    _gate(main_check, sft_cfg, outputs.closure)
    return typed


def _gate(check: dict, sft_cfg: SftSection, where: Path) -> None:
    if sft_cfg.min_closure > 0 and check["rate"] < sft_cfg.min_closure:
        raise UserError(
            f"the SFT model ended {check['closed']} of {check['total']} held-out answers with "
            f"{check['end_token']} (closure {check['rate']:.2f}), below sft.min_closure "
            f"{sft_cfg.min_closure}",
            where=str(where),
            fix="look at audit.json: initialise the untrained template tokens (--init mean), "
            "train longer (--max-steps) or raise sft.closure_max_tokens",
        )
