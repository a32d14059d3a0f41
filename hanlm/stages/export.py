"""The export stage: the run's latest pretraining checkpoint -> pretrain/hf (the library,
hanlm.train.export, does the writing); `export_chosen` writes a chosen checkpoint elsewhere.

`run_gguf` (`hanlm export --format gguf`) turns an exported folder (the chat model's sft/hf when
there is one, else pretrain/hf, or any folder given) into a GGUF file and its Ollama Modelfile
in DIR/gguf/ (hanlm.share.gguf writes them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from hanlm.chat_template import TOKENIZER_CONFIG_FILE
from hanlm.config import Config
from hanlm.console import info
from hanlm.errors import UserError
from hanlm.files import atomic_write_text, claim_output_file, read_json
from hanlm.model_folder import export_damage, is_model_folder
from hanlm.share import gguf as gguf_lib
from hanlm.stages import run_facts
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext
from hanlm.train import checkpoint_layout, export
from hanlm.train.results import ExportRecord


def resolve_checkpoint(run: RunDir, checkpoint: str | None) -> Path:
    """The checkpoint to export: the latest committed one, a step number, or a folder's path;
    its files are checked against its manifest first."""
    path = _locate_checkpoint(run, checkpoint)
    root = run.pretrain.checkpoints
    if not (path / checkpoint_layout.MANIFEST).is_file():
        # a step named explicitly gets the same check as the latest one: no manifest, no export
        raise UserError(
            f"checkpoint {path} is not committed: it has no {checkpoint_layout.MANIFEST}, so its "
            "save did not finish (or the folder was damaged) and its files cannot be checked",
            fix="export a committed step with --checkpoint STEP "
            f"(committed: {_committed_steps(root) or 'none yet'})",
        )
    problem = checkpoint_layout.verify(path)
    if problem:
        raise UserError(
            f"checkpoint {path} is damaged: {problem}",
            fix="export an older step with --checkpoint STEP",
        )
    return path


def _locate_checkpoint(run: RunDir, checkpoint: str | None) -> Path:
    root = run.pretrain.checkpoints
    if checkpoint is None:
        latest = checkpoint_layout.latest(root)
        if latest is None:
            _no_committed_checkpoint(run)
        return latest
    text = str(checkpoint).strip()
    if text.isdigit():
        path = checkpoint_layout.step_dir(root, int(text))
        if not (path / checkpoint_layout.TRAINER_STATE).is_file():
            raise UserError(
                f"no committed checkpoint for step {int(text)} in {root}",
                fix=f"choose one of the steps {_committed_steps(root) or 'none yet'}",
            )
        return path
    path = Path(text) if Path(text).exists() else root / text
    if not path.is_dir():
        raise UserError(
            f"checkpoint {text!r} is neither a step number nor a folder",
            fix=f"give a step ({_committed_steps(root) or 'none yet'}) or a step-NNNNNNNN folder",
        )
    export.trainer_state(path)  # a UserError unless it is a committed checkpoint
    return path


def _no_committed_checkpoint(run: RunDir) -> NoReturn:
    """The UserError for a run with nothing to export, saying whether checkpoints were started."""
    root, run_dir = run.pretrain.checkpoints, run.root
    uncommitted = [path.name for path in checkpoint_layout.uncommitted(root)]
    if not uncommitted:
        raise UserError(
            f"no checkpoint to export in {root}", fix=f"run `hanlm pretrain --run {run_dir}` first"
        )
    # a finished pretraining is skipped when run again: only --force trains (and saves) anew
    force = " --force" if run_facts.finished(run, "pretrain") else ""
    raise UserError(
        f"no committed checkpoint to export in {root}: {', '.join(uncommitted)} "
        f"{'has' if len(uncommitted) == 1 else 'have'} no {checkpoint_layout.MANIFEST}, so the "
        "save did not finish or the folder was damaged, and its files cannot be trusted",
        fix=f"put back a complete copy of a checkpoint (with its {checkpoint_layout.MANIFEST}), or "
        f"train again with `hanlm pretrain --run {run_dir}{force}`, which commits new ones",
    )


def _committed_steps(root: Path) -> str:
    """The steps of the committed checkpoints (those with a manifest), as a list for messages."""
    steps = (
        checkpoint.name.removeprefix("step-") for checkpoint in checkpoint_layout.committed(root)
    )
    return ", ".join(str(int(step)) for step in steps if step.isdigit())


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> list | None:
    """Which checkpoint it exports: the latest committed one, by name and training fingerprint."""
    latest = checkpoint_layout.latest(run.pretrain.checkpoints)
    if latest is None:
        return None
    return [latest.name, checkpoint_layout.read_trainer_state(latest).get("fingerprint")]


def damage(run: RunDir) -> str | None:
    return export_damage(run.pretrain.export)


def _model_config(cfg: Config, run: RunDir):
    return run_facts.model_config(cfg.model, run, seq_len=cfg.pretrain.seq_len)


def build(ctx: StageContext) -> ExportRecord:
    """The run's latest pretraining checkpoint as a plain Hugging Face folder."""
    run = ctx.run
    source = resolve_checkpoint(run, None)
    started = time.perf_counter()
    record = export.write_export(
        source,
        ctx.out,
        model_config=_model_config(ctx.cfg, run),
        tokenizer_dir=run_facts.tokenizer_path(run).parent,
    )
    info(
        f"export: {source.name} ({record.tokens:,} tokens seen) -> {run.pretrain.export} "
        f"({time.perf_counter() - started:.1f}s)"
    )
    return record


@dataclass(frozen=True)
class ChosenExport:
    """What `export_chosen` did: the folder's record, and whether it already held the export."""

    record: ExportRecord
    skipped: bool


def export_chosen(
    cfg: Config, run: RunDir | Path, *, checkpoint: str | None, out: Path | None, force: bool
) -> ChosenExport:
    """`hanlm export --checkpoint STEP` or `--out DIR`: a chosen checkpoint into a chosen folder,
    outside the pipeline (the run's pretrain/hf stays the export stage's, with the latest
    checkpoint): by default RUN/pretrain/hf-step-NNNNNNNN. A folder that already holds this
    export, whole, is left as it is; one that holds another is replaced only with `force` (a
    default folder of the run's is hanlm's own and always replaced)."""
    run = RunDir.of(run)
    source = resolve_checkpoint(run, checkpoint)
    replace = force or out is None
    out = Path(out) if out is not None else run.pretrain.export.with_name(f"hf-{source.name}")
    config = _model_config(cfg, run)
    tokenizer_dir = run_facts.tokenizer_path(run).parent
    wanted = export.export_fingerprint(source, config, tokenizer_dir, None, torch.float32)
    if _record_fingerprint(out) == wanted and export_damage(out) is None:
        info(f"export: {out} already holds {source.name}, skipped")
        return ChosenExport(ExportRecord.read(out / export.RECORD), skipped=True)
    export.export_checkpoint(
        source, out, model_config=config, tokenizer_dir=tokenizer_dir, replace_earlier=replace
    )
    record = ExportRecord.read(out / export.RECORD)
    info(f"export: {source.name} ({record.tokens:,} tokens seen) -> {out}")
    return ChosenExport(record, skipped=False)


def _record_fingerprint(folder: Path) -> str | None:
    try:
        return ExportRecord.read(folder / export.RECORD).fingerprint
    except UserError:
        return None


# --- GGUF -----------------------------------------------------------------------------------------


def gguf_source(run: RunDir, source: Path | None) -> tuple[Path, str]:
    """The folder to convert and its label for file names: the one given, else the run's chat
    model (sft/hf), else its base model (pretrain/hf)."""
    if source is not None:
        return Path(source), Path(source).name
    for folder, label in ((run.sft.export, "chat"), (run.pretrain.export, "base")):
        if is_model_folder(folder):
            return folder, label
    raise UserError(
        f"no exported model in {run.root} to write as GGUF (neither sft/hf nor pretrain/hf)",
        fix=f"run `hanlm export --run-dir {run.root}` first, or name a folder with --source",
    )


def _is_modelfile(path: Path) -> bool:
    try:
        return path.read_text(encoding="utf-8").startswith("FROM ./")
    except (OSError, UnicodeDecodeError):
        return False


def run_gguf(
    cfg: Config,
    run: RunDir | Path,
    *,
    gguf_type: str = "f16",
    source: Path | None = None,
    out: Path | None = None,
    force: bool = False,
) -> dict:
    """Write a GGUF file (and an Ollama Modelfile next to it) from an exported model folder."""
    run = RunDir(run) if not isinstance(run, RunDir) else run
    if gguf_type not in gguf_lib.GGUF_TYPES:
        raise UserError(
            f"unknown GGUF type {gguf_type!r}", fix=f"use one of {', '.join(gguf_lib.GGUF_TYPES)}"
        )
    folder, label = gguf_source(run, source)
    out = Path(out) if out is not None else run.gguf / f"{label}-{gguf_type}.gguf"
    if out.suffix != ".gguf":
        raise UserError(f"the GGUF file {out} should end in .gguf", fix="name it NAME.gguf")
    modelfile = out.with_suffix(".Modelfile")
    # both outputs are checked before the (long) write, so a refusal leaves nothing half-done
    claim_output_file(
        out, is_earlier_output=gguf_lib.is_gguf_file, replace_earlier=force, name="GGUF file"
    )
    claim_output_file(
        modelfile, is_earlier_output=_is_modelfile, replace_earlier=force, name="Modelfile"
    )
    started = time.perf_counter()
    summary = gguf_lib.write_gguf(
        folder, out, gguf_type=gguf_type, name=f"{run.root.name}-{label}", replace_earlier=force
    )
    template = read_json(folder / TOKENIZER_CONFIG_FILE).get("chat_template")
    atomic_write_text(modelfile, gguf_lib.modelfile(out, template, cfg.generate))
    info(
        f"export: {folder} -> {out} ({gguf_type}, {summary['bytes'] / 1e6:.1f} MB, "
        f"pre-tokenizer {summary['pre_tokenizer']}), Ollama: ollama create NAME -f {modelfile}"
    )
    return {
        **summary,
        "modelfile": str(modelfile),
        "seconds": round(time.perf_counter() - started, 3),
    }


STAGE = Stage(
    name="export",
    version=1,
    output=lambda run: run.pretrain.export,
    result=ExportRecord,
    reads=("model", "pretrain.seq_len"),
    after=("tokenizer", "shards", "pretrain"),
    build=build,
    inputs=inputs,
    damage=damage,
)
