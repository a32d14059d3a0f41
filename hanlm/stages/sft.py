"""The sft stage: chat fine-tuning of the run's pretrained model (or `sft.model`) on the run's
demo conversations (or `sft.data`) into sft/: where the source model and the chat data come
from; hanlm.stages.sft_variants trains and checks each variant.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hanlm import ranks
from hanlm.chat import template_base
from hanlm.config import Config, SftSourceSection
from hanlm.console import info
from hanlm.data import chat_sources
from hanlm.data.shards import ShardsManifest
from hanlm.errors import UserError
from hanlm.files import file_sha256, fingerprint
from hanlm.inference import load_tokenizer
from hanlm.model_folder import check_model_folder, export_damage, is_model_folder
from hanlm.stages import run_facts, sft_variants
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext
from hanlm.train import checkpoint_layout
from hanlm.train import sft as sft_lib
from hanlm.train.results import SftSummary

# --- the source model and the data -----------------------------------------------------------------


def source_of(cfg: Config, run: RunDir) -> sft_lib.SftSource:
    """Where SFT starts: `sft.model`, else the run's latest pretraining checkpoint, else its
    exported pretrain/hf."""
    if cfg.sft.model:
        path = check_model_folder(cfg.sft.model)  # its tokenizer is SFT's tokenizer
        return _hf_source(path, run)
    latest = checkpoint_layout.latest(run.pretrain.checkpoints)
    if latest is not None:
        state = checkpoint_layout.read_trainer_state(latest)
        return sft_lib.SftSource(
            kind="checkpoint",
            path=latest,
            tokenizer_dir=run.tokenizer,
            fingerprint=fingerprint(latest.name, state.get("fingerprint"), state.get("step")),
            pretrain_counts=_pretrain_counts(run),
        )
    hf = run.pretrain.export
    if is_model_folder(hf):
        return _hf_source(hf, run)
    raise UserError(
        f"no pretrained model in {run.root}/pretrain",
        fix=f"run `hanlm pretrain --run {run.root}` first, or give --model HF_DIR",
    )


def _hf_source(path: Path, run: RunDir) -> sft_lib.SftSource:
    # the shard manifest's special-token counts only when the model was pretrained in this run
    counts = None if _outside(path, run.root) else _pretrain_counts(run)
    fp = _hf_fp(path, None if _outside(path, run.root) else run.root)
    return sft_lib.SftSource(
        kind="hf", path=path, tokenizer_dir=path, fingerprint=fp, pretrain_counts=counts
    )


def _hf_fp(path: Path, run_root: Path | None) -> str:
    """The folder by where it is and its weight files' sizes and times; a folder inside the run by
    its place in the run, so that a run directory moved elsewhere keeps its SFT."""
    where = (
        str(path.resolve())
        if run_root is None
        else path.resolve().relative_to(run_root.resolve()).as_posix()
    )
    weights = path / "model.safetensors"
    if weights.is_file():
        return fingerprint(where, weights.stat().st_size, weights.stat().st_mtime_ns)
    shards = [
        (shard.name, shard.stat().st_size, shard.stat().st_mtime_ns)
        for shard in path.glob("*.safetensors")
    ]
    return fingerprint(where, sorted(shards))


def _pretrain_counts(run: RunDir) -> dict[str, int] | None:
    manifest = ShardsManifest.read_if_present(run.shards_manifest)
    return None if manifest is None else manifest.special_token_counts


def _outside(path: Path, run_dir: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(run_dir).resolve())
        return False
    except ValueError:
        return True


def with_model_config(cfg: Config, source: sft_lib.SftSource, run: RunDir):
    """A checkpoint source with the model config to build for it (the run's model at SFT's
    length); a Hugging Face folder brings its own."""
    if source.kind != "checkpoint":
        return source
    seq_len = max(cfg.pretrain.seq_len, cfg.sft.seq_len)
    config = run_facts.model_config(cfg.model, run, seq_len=seq_len)
    return dataclasses.replace(source, model_config=config)


def data_sources(cfg: Config, run: RunDir) -> list[SftSourceSection]:
    """The chat data's sources: [[sft.sources]], sft.data as one, else the demo world's."""
    sources = cfg.sft.source_list()
    if sources:
        return sources
    return [SftSourceSection(name="chat", inputs=[str(run.demo_file("chat"))], format="messages")]


# --- the stage ------------------------------------------------------------------------------------

# What changes nothing SFT computes: pretraining's bookkeeping, the cadence of pretraining's
# validation (SFT has its own), SFT's own bookkeeping, and the closure it must reach to count as
# finished (checked after training).
NOT_COMPUTED = (
    *run_facts.TRAINING_BOOKKEEPING,
    "logging.eval_every", "logging.eval_batches",
    "sft.checkpoint.resume", "sft.checkpoint.every_minutes", "sft.logging.log_every",
    "sft.optimizer.max_nonfinite_steps", "sft.min_closure",
)  # fmt: skip


def validate(cfg: Config, run: RunDir, options: NoOptions) -> None:
    """Its conversations' inputs must be there, and a model to start from."""
    for source in cfg.sft.source_list():
        for spec in source.inputs:
            chat_sources.input_files(spec)  # no match, an unsupported file: its UserError
    model = source_of(cfg, run)
    if model.kind == "hf":
        tokenizer = load_tokenizer(model.tokenizer_dir)
        if not template_base.has_template(tokenizer):
            template_base.check_can_add(tokenizer, str(model.tokenizer_dir))
    elif cfg.model.init_from and not template_base.has_template(load_tokenizer(run.tokenizer)):
        raise UserError(
            f"the run continued pretraining {cfg.model.init_from}, whose tokenizer has no chat "
            "template: its checkpoints cannot take one in place",
            fix=f"export it (`hanlm export --run {run.root}`) and fine-tune the export: "
            f"`hanlm sft --run {run.root} --model {run.pretrain.export}` adds hanlm's template",
        )


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> list:
    """The model it starts from and its conversations, by identity (the demo world's by
    content: it lives in the run)."""
    source = source_of(cfg, run)
    if not cfg.sft.source_list():
        return [source.fingerprint, file_sha256(run.demo_file("chat"))]
    return [source.fingerprint, chat_sources.identity(cfg.sft.source_list())]


def damage(run: RunDir) -> str | None:
    # its final checkpoint is kept: a rebuild resumes there and only exports again
    return export_damage(run.sft.export)


def templated(source: sft_lib.SftSource, run: RunDir, seed: int) -> sft_lib.SftSource:
    """The source itself, or, for a base model whose tokenizer has no chat template, its copy
    with hanlm's template and tokens (hanlm.chat.template_base) in RUN/sft/base-FINGERPRINT:
    rank 0 writes it once, the other ranks wait for it."""
    if source.kind != "hf" or template_base.has_template(load_tokenizer(source.tokenizer_dir)):
        return source
    out = run.sft.root / f"base-{source.fingerprint[:12]}"
    added = template_base.read_added(out)
    if added is None:
        if ranks.is_main():
            added = template_base.add_template(source.path, out, seed=seed)
        else:
            added = template_base.wait_for(out)
    if ranks.is_main():
        info(added.line())
    return dataclasses.replace(source, path=out, tokenizer_dir=out, added_tokens=added.tokens)


def build(ctx: StageContext) -> SftSummary:
    cfg, run = ctx.cfg, ctx.run
    source = templated(source_of(cfg, run), run, cfg.run.seed)
    conversations, reports = chat_sources.read_all(
        data_sources(cfg, run), strict=cfg.sft.strict, seed=cfg.run.seed
    )
    data_fp = fingerprint(conversations)
    prepared = sft_variants.prepare(
        cfg,
        with_model_config(cfg, source, run),
        conversations,
        reports,
        data_fp,
        run_facts.decontam_index(run),
        run.sft,
    )
    common = {"data_fp": data_fp, "settings_fp": ctx.fingerprint, "force": ctx.force}
    return sft_variants.fine_tune(cfg, prepared, run.sft, common)


STAGE = Stage(
    name="sft",
    version=1,
    output=lambda run: run.sft.root,
    result=SftSummary,
    reads=(
        "sft",
        "model",
        "precision",
        "parallel",
        "checkpoint",
        "logging",
        "distill",
        "pretrain.seq_len",
        "run.seed",
    ),
    unfingerprinted=NOT_COMPUTED,
    after=("decontam",),  # the index its conversations are checked against; the source model
    # is an input by identity (a run's checkpoint or export, or sft.model)
    writes="in_place",
    all_ranks=True,
    logs_to_trackers=True,
    uses_demo=lambda cfg, options: not cfg.sft.source_list(),
    build=build,
    validate=validate,
    inputs=inputs,
    damage=damage,
)
