"""`hanlm sft`: chat fine-tuning whose answers end.

The field report's trap: pretraining never saw the chat template's special tokens, their rows
stayed untrained, and after SFT the model closed 0 of 50 answers (49 of 50 once initialised).
This stage makes it impossible to miss:

1. the source model: the run's latest pretraining checkpoint (else DIR/pretrain/hf), or
   `sft.model` (`--model HF_DIR`, a hanlm export);
2. the data (`sft.data`, default DIR/demo/chat.jsonl) read and checked, conversations holding
   benchmark items dropped or refused (the run's decontam index), N held out (seeded);
3. the special-token audit (hanlm.chat.tokens) -> audit.json and a table;
4. the untrained template tokens initialised (`sft.init`), their rows trainable, optionally
   with their own step size;
5. the pretraining loop (Trainer) on assistant tokens only, each turn's <|eot|> included,
   with checkpoints and resume in DIR/sft/checkpoints;
6. export to DIR/sft/hf with generation_config.eos_token_id = [<|eot|>, <|endoftext|>];
7. the closure check on the held-out prompts -> closure.json, and the `sft.min_closure` gate;
8. `sft.compare_inits`: the same SFT with other inits into DIR/sft/ablation/<init>/, summed up
   in closure_by_init.json.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from hanlm.chat import closure, tokens
from hanlm.config import Config, SftSection
from hanlm.console import info, warn
from hanlm.data import chat_data
from hanlm.errors import UserError
from hanlm.files import (
    atomic_write_json,
    file_sha256,
    fingerprint,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.train import checkpoint, distill, parallel, precision
from hanlm.train.optim import adamw
from hanlm.train.trainer import Schedule, Trainer, TrainerSettings

STAGE = "sft"
HELDOUT_SEED = 8  # a stream of its own: the split does not move when other settings do


# --- the source model -----------------------------------------------------------------------------


def source_of(cfg: Config, run_dir: Path | None) -> dict:
    """Where SFT starts: {kind: checkpoint|hf, path, tokenizer_dir, fingerprint}."""
    if cfg.sft.model:
        from hanlm.model_folder import check_model_folder

        path = check_model_folder(cfg.sft.model)  # its tokenizer is SFT's tokenizer
        return {"kind": "hf", "path": path, "tokenizer_dir": path, "fingerprint": _hf_fp(path)}
    if run_dir is None:
        raise UserError("SFT needs a run directory or --model HF_DIR")
    latest = checkpoint.latest(Path(run_dir) / "pretrain" / "checkpoints")
    if latest is not None:
        state = checkpoint.read_trainer_state(latest)
        return {
            "kind": "checkpoint",
            "path": latest,
            "tokenizer_dir": Path(run_dir) / "tokenizer",
            "fingerprint": fingerprint(latest.name, state.get("fingerprint"), state.get("step")),
        }
    hf = Path(run_dir) / "pretrain" / "hf"
    if (hf / "config.json").is_file():
        return {"kind": "hf", "path": hf, "tokenizer_dir": hf, "fingerprint": _hf_fp(hf)}
    raise UserError(
        f"no pretrained model in {run_dir}/pretrain",
        fix=f"run `hanlm pretrain --run {run_dir}` first, or give --model HF_DIR",
    )


def _hf_fp(path: Path) -> str:
    weights = path / "model.safetensors"
    if weights.is_file():
        return fingerprint(str(path.resolve()), weights.stat().st_size, weights.stat().st_mtime_ns)
    shards = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.glob("*.safetensors")]
    return fingerprint(str(path.resolve()), sorted(shards))


def load_source_model(source: dict, cfg: Config, run_dir: Path | None):
    """(CPU model in train mode, its config)."""
    from hanlm.train import export

    if source["kind"] == "hf":
        model = export.load_exported(source["path"])
        return model.float().train(), model.config
    from hanlm.data import shards as shards_stage
    from hanlm.model import model_config

    problem = checkpoint.verify(source["path"])  # its files against its manifest
    if problem:
        raise UserError(
            f"the pretraining checkpoint {source['path']} is damaged: {problem}",
            fix="move that step folder away (SFT then starts from the previous committed "
            "checkpoint), or pretrain again",
        )
    manifest = shards_stage.load_manifest(run_dir)
    seq_len = max(cfg.pretrain.seq_len, cfg.sft.seq_len)
    config = model_config(cfg.pretrain.preset, vocab_size=manifest["vocab_size"], seq_len=seq_len)
    model = export.load_checkpoint_model(source["path"], config)
    return model.train(), config


def pretrain_counts(source: dict, run_dir: Path | None) -> dict[str, int] | None:
    """The shard manifest's special-token counts when the model was pretrained in this run."""
    if run_dir is None or (source["kind"] == "hf" and _outside(source["path"], run_dir)):
        return None
    manifest = Path(run_dir) / "shards" / "manifest.json"
    if not manifest.is_file():
        return None
    return read_json(manifest).get("special_token_counts")


def _outside(path: Path, run_dir: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(run_dir).resolve())
        return False
    except ValueError:
        return True


# --- data -----------------------------------------------------------------------------------------


def data_path(cfg: Config, run_dir: Path | None) -> Path:
    if cfg.sft.data:
        return Path(cfg.sft.data)
    if run_dir is None:
        raise UserError("no chat data", fix="give --data a messages JSONL file")
    return Path(run_dir) / "demo" / "chat.jsonl"


def decontaminate(conversations: list[dict], run_dir: Path | None, s: SftSection):
    """(kept conversations, report): those holding a benchmark item are dropped or refused."""
    try:
        from hanlm.data.decontam import load_run_index
    except ImportError:
        return conversations, {"checked": False, "reason": "hanlm.data.decontam not available"}
    index = load_run_index(run_dir) if run_dir is not None else None
    if index is None:
        return conversations, {"checked": False, "reason": "the run has no decontam index"}
    kept, dropped = [], []
    for conversation in conversations:
        text = chat_data.conversation_text(conversation["messages"])
        hits = index.matches(text, min_coverage=s.contamination_coverage)
        if hits:
            dropped.append({"id": conversation["id"], "items": hits})
        else:
            kept.append(conversation)
    if dropped and s.contaminated == "fail":
        first = dropped[0]
        raise UserError(
            f"{len(dropped)} SFT conversations hold benchmark items (first: {first['id']} holds "
            f"{first['items'][0]['benchmark']} item {first['items'][0]['item_id']})",
            fix="remove them from the data, or set sft.contaminated = drop to drop them",
        )
    if dropped:
        warn(f"sft: dropped {len(dropped)} conversations holding benchmark items")
    return kept, {"checked": True, "dropped": len(dropped), "conversations": dropped}


def split_heldout(conversations: list[dict], n: int, seed: int) -> tuple[list, list]:
    if len(conversations) < 2:
        raise UserError(
            f"SFT needs at least 2 conversations, the data has {len(conversations)}",
            fix="give more conversations",
        )
    n = min(n, len(conversations) // 2)
    order = np.random.default_rng([seed, HELDOUT_SEED]).permutation(len(conversations))
    held = set(order[:n].tolist())
    train = [c for i, c in enumerate(conversations) if i not in held]
    heldout = [conversations[i] for i in sorted(held)]
    return train, heldout


def load_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if not tok.chat_template:
        raise UserError(
            f"the tokenizer in {tokenizer_dir} has no chat template",
            fix="use a hanlm tokenizer (its tokenizer_config.json carries the template)",
        )
    return tok


# --- one training -----------------------------------------------------------------------------------


def _accumulation(s: SftSection, world_size: int) -> int:
    per_pass = s.micro_batch * world_size
    if s.batch_rows % per_pass:
        raise UserError(
            f"sft.batch_rows {s.batch_rows} is not a multiple of micro_batch x ranks = {per_pass}",
            fix=f"use --set sft.batch_rows={max(per_pass, s.batch_rows // per_pass * per_pass)}",
        )
    return s.batch_rows // per_pass


def train_once(
    *,
    cfg: Config,
    run_dir: Path | None,
    out: Path,
    source: dict,
    audit: dict,
    special: dict,
    rows: dict,
    init: str,
    data_fp: str,
    settings_fp: str,
    force: bool,
) -> dict:
    """Initialise, train and checkpoint one SFT into `out`; returns the trainer's summary and
    the model config (the weights are in the latest checkpoint)."""
    s, p = cfg.sft, cfg.pretrain
    d = parallel.init(p.device)
    try:
        plan = precision.resolve(
            p.precision if p.precision in ("fp32", "bf16") else "bf16", d.device
        )
        mode = parallel.resolve_mode(p.parallel, d)
        accumulation = _accumulation(s, d.world_size)
        if force or s.resume == "never":
            if d.is_main:
                shutil.rmtree(out / "checkpoints", ignore_errors=True)
                (out / "metrics.jsonl").unlink(missing_ok=True)
            parallel.barrier(d)
        model, mconfig = load_source_model(source, cfg, run_dir)
        ids = [special[n]["id"] for n in audit["untrained_template_tokens"]]
        text_ids = None
        if init == "text":
            text_ids = load_tokenizer(source["tokenizer_dir"]).encode(
                s.init_text, add_special_tokens=False
            )
        done = tokens.initialise(model, ids, init, special, text_ids=text_ids, seed=cfg.run.seed)
        model = model.to(d.device)
        model = parallel.parallelize(model, d, mode, compute_dtype=plan.compute_dtype)
        optimizer = adamw(
            model,
            lr=s.lr,
            weight_decay=s.weight_decay,
            betas=(p.beta1, p.beta2),
            eps=p.eps,
            device=d.device,
        )
        if s.new_token_lr_scale != 1.0 and ids and init != "none":
            if mode == "fsdp":
                warn("sft: new_token_lr_scale is not applied under FSDP (rows are sharded)")
            else:
                tokens.RowStepScale(optimizer, parallel.unwrap(model), ids, s.new_token_lr_scale)
        common = {"micro_batch": s.micro_batch, "rank": d.rank, "world_size": d.world_size}
        train_loader = chat_data.ChatLoader(*rows["train"], seed=cfg.run.seed, **common)
        try:
            val_loader = chat_data.ChatLoader(*rows["heldout"], shuffle=False, **common)
        except UserError:
            val_loader = None
        from hanlm.model import flops_per_token
        from hanlm.plan.catalogue import device_peak_flops

        model_fp = fingerprint("sft-model", source["fingerprint"], data_fp, cfg.run.seed, init)
        settings = TrainerSettings(
            accumulation=accumulation,
            grad_clip=s.grad_clip,
            log_every=s.log_every,
            eval_every=s.eval_every,
            eval_batches=s.eval_batches,
            checkpoint_every=s.checkpoint_every,
            flops_per_token=flops_per_token(mconfig, s.seq_len)["total"],
            peak_flops=device_peak_flops(d.device, plan.name)[0],
            fingerprint=model_fp,
            settings=settings_fp,
        )
        schedule = Schedule(s.max_steps, s.lr, s.warmup_steps, s.min_lr_ratio, "cosine", 0.2)
        policy = checkpoint.Policy(**cfg.checkpoint.model_dump(exclude={"every_minutes"}))
        trainer = Trainer(
            model=model,
            optimizer=optimizer,
            train_loader=train_loader,
            val_loader=val_loader,
            schedule=schedule,
            settings=settings,
            dist=d,
            mode=mode,
            plan=plan,
            out_dir=out,
            checkpoints=checkpoint.CheckpointManager(out / "checkpoints", d, policy),
            # distillation, when enabled, applies to SFT as to pretraining
            loss_fn=distill.make_loss_fn(
                cfg.distill,
                mconfig.get_text_config().vocab_size,
                d.device,
                student_tokenizer=Path(source["tokenizer_dir"]),
            ),
        )
        resumed = s.resume == "auto" and not force and trainer.resume()
        if d.is_main:
            info(
                f"sft ({init}): {s.max_steps} steps of {s.batch_rows} rows x {s.seq_len} tokens; "
                f"{train_loader.rows} rows, {train_loader.trained_tokens:,} trained tokens"
                + ("; resumed" if resumed else "")
            )
        result = trainer.fit()
        parallel.barrier(d)
        return {**result, "init": done, "config": mconfig, "is_main": d.is_main}
    finally:
        parallel.shutdown(d)


# --- the stage ------------------------------------------------------------------------------------


def stage_fp(cfg: Config, run_dir: Path | None, source: dict, data_fp: str) -> str:
    skip = {"resume", "log_every", "min_closure"}
    precision_keys = {"precision", "device", "parallel", "beta1", "beta2", "eps", "preset"}
    return fingerprint(
        STAGE,
        cfg.sft.model_dump(exclude=skip),
        cfg.pretrain.model_dump(include=precision_keys),
        cfg.run.seed,
        source["fingerprint"],
        data_fp,
        # as in pretraining: runs without distillation keep their fingerprints
        *([cfg.distill.model_dump(mode="json")] if cfg.distill.enabled else []),
    )


def _gate(result: dict, s: SftSection, where: Path) -> None:
    if s.min_closure > 0 and result["rate"] < s.min_closure:
        raise UserError(
            f"the SFT model ended {result['closed']} of {result['total']} held-out answers with "
            f"<|eot|> (closure {result['rate']:.2f}), below sft.min_closure {s.min_closure}",
            where=str(where),
            fix="look at audit.json: initialise the untrained template tokens (--init mean), "
            "train longer (--max-steps) or raise sft.closure_max_tokens",
        )


def run(cfg: Config, run_dir: Path | None, *, force: bool = False, out: Path | None = None) -> dict:
    run_dir = Path(run_dir) if run_dir is not None else None
    if out is None:
        if run_dir is None:
            raise UserError("SFT needs a run directory or an output folder")
        out = run_dir / STAGE
    out = Path(out)
    s = cfg.sft
    source = source_of(cfg, run_dir)
    data_file = data_path(cfg, run_dir)
    conversations = chat_data.read_conversations(data_file)
    data_fp = file_sha256(data_file)
    fp = stage_fp(cfg, run_dir, source, data_fp)
    if not force and stage_fingerprint(out) == fp:
        info(f"sft: up to date in {out}, skipped")
        return read_json(out / "summary.json")
    (out / "stage.json").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    conversations, contamination = decontaminate(conversations, run_dir, s)
    train_conversations, heldout = split_heldout(conversations, s.heldout, cfg.run.seed)
    tokenizer = load_tokenizer(source["tokenizer_dir"])
    special = tokens.load_special_tokens(source["tokenizer_dir"])
    eot, pad, eod = (special[k]["id"] for k in ("eot", "pad", "eod"))
    rows, data_report, heldout = _rows(tokenizer, train_conversations, heldout, s, eot, pad)
    data_report.update({"file": str(data_file), "sha256": data_fp, "contamination": contamination})

    model, _ = load_source_model(source, cfg, run_dir)
    audit = tokens.audit(model, special, pretrain_counts(source, run_dir))
    audit["source"] = str(source["path"])
    del model
    tokens.print_audit(audit)
    atomic_write_json(out / "audit.json", audit)
    atomic_write_json(out / "data.json", data_report)

    common = {
        "cfg": cfg,
        "run_dir": run_dir,
        "source": source,
        "audit": audit,
        "special": special,
        "rows": rows,
        "data_fp": data_fp,
        "settings_fp": fp,
        "force": force,
    }
    result = train_once(out=out, init=s.init, **common)
    is_main = result["is_main"]
    summary: dict = {"init": s.init, "step": result["step"], "tokens": result["tokens"]}
    for key in ("val_loss",):
        if key in result:
            summary[key] = result[key]
    by_init: dict[str, float] = {}
    if is_main:
        _export(out, result["config"], source["tokenizer_dir"], [eot, eod])
        from hanlm.train import export

        model = export.load_exported(out / "hf")
        check = closure.check(
            model,
            load_tokenizer(out / "hf"),
            heldout,
            end_of_turn_id=eot,
            pad_id=pad,
            max_new_tokens=s.closure_max_tokens,
            init=s.init,
        )
        atomic_write_json(out / "closure.json", check)
        by_init[s.init] = check["rate"]
        info(
            f"sft: closure {check['closed']}/{check['total']} ({check['rate']:.2f}) with init {s.init}"
        )
    for other in dict.fromkeys(s.compare_inits):
        if other == s.init:
            continue
        folder = out / "ablation" / other
        ablation = train_once(out=folder, init=other, **common)
        if is_main:
            from hanlm.train import export

            latest = checkpoint.latest(folder / "checkpoints")
            model = export.load_checkpoint_model(latest, ablation["config"])
            check = closure.check(
                model,
                tokenizer,
                heldout,
                end_of_turn_id=eot,
                pad_id=pad,
                max_new_tokens=s.closure_max_tokens,
                init=other,
            )
            atomic_write_json(folder / "closure.json", check)
            by_init[other] = check["rate"]
            info(f"sft: ablation closure {check['closed']}/{check['total']} with init {other}")
    if not is_main:
        return summary
    atomic_write_json(out / "closure_by_init.json", by_init)
    main_check = read_json(out / "closure.json")
    summary.update(
        {
            "closure": {k: main_check[k] for k in ("closed", "total", "rate")},
            "closure_by_init": by_init,
            "untrained_template_tokens": audit["untrained_template_tokens"],
            "hf": str(out / "hf"),
            "data": {k: v for k, v in data_report.items() if k != "contamination"},
            "contaminated_dropped": contamination.get("dropped", 0),
        }
    )
    atomic_write_json(out / "summary.json", summary)
    _gate(main_check, s, out / "closure.json")
    write_stage_marker(out, STAGE, fp)
    return summary


def _rows(tokenizer, train, heldout, s: SftSection, eot: int, pad: int):
    def encode(conversations):
        return [chat_data.tokenize(tokenizer, c["messages"], eot) for c in conversations]

    train_ids, train_mask, too_long = chat_data.build_rows(
        encode(train), s.seq_len, pad, packing=s.packing
    )
    held_encoded = encode(heldout)
    held_ids, held_mask, held_too_long = chat_data.build_rows(
        held_encoded, s.seq_len, pad, packing=s.packing
    )
    # The closure check asks only what the model could have learned: conversations that fit.
    fitting = [
        c for c, (ids, _) in zip(heldout, held_encoded, strict=True) if len(ids) <= s.seq_len + 1
    ]
    if len(train_ids) == 0:
        raise UserError(
            f"every training conversation is longer than sft.seq_len + 1 = {s.seq_len + 1} tokens",
            fix="raise sft.seq_len",
        )
    report = {
        "conversations": len(train) + len(heldout),
        "train_conversations": len(train),
        "heldout_conversations": len(heldout),
        "too_long_dropped": too_long + held_too_long,
        "train_rows": len(train_ids),
        "trained_tokens": int(train_mask[:, 1:].sum()),
        "packing": s.packing,
    }
    if too_long:
        warn(f"sft: {too_long} conversations longer than {s.seq_len + 1} tokens were left out")
    if not fitting:
        raise UserError(
            f"no held-out conversation fits sft.seq_len + 1 = {s.seq_len + 1} tokens",
            fix="raise sft.seq_len or sft.heldout",
        )
    report["closure_prompts"] = len(fitting)
    return {"train": (train_ids, train_mask), "heldout": (held_ids, held_mask)}, report, fitting


def _export(out: Path, config, tokenizer_dir: Path, eos_ids: list[int]) -> None:
    from hanlm.train import export

    latest = checkpoint.latest(out / "checkpoints")
    export.export_checkpoint(
        latest, out / "hf", model_config=config, tokenizer_dir=tokenizer_dir, eos_token_ids=eos_ids
    )
    info(f"sft: exported {latest.name} -> {out / 'hf'} (eos: <|eot|>, <|endoftext|>)")
