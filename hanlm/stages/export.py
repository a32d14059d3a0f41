"""The export stage: the run's latest (or a chosen) pretraining checkpoint -> pretrain/hf.

Skipped when the folder already holds an export of the same checkpoint, model config and
tokenizer (hanlm.train.export.export_fingerprint); the library does the writing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NoReturn

import torch

from hanlm.config import Config
from hanlm.console import info
from hanlm.errors import UserError
from hanlm.files import read_json, stage_fingerprint
from hanlm.model import model_config
from hanlm.stages import shards as shards_stage
from hanlm.stages import tokenizer as tokenizer_stage
from hanlm.stages.rundir import RunDir
from hanlm.train import checkpoint as checkpoint_lib
from hanlm.train import export


def resolve_checkpoint(run: RunDir, checkpoint: str | None) -> Path:
    """The checkpoint to export: the latest committed one, a step number, or a folder's path;
    its files are checked against its manifest first."""
    path = _locate_checkpoint(run, checkpoint)
    root = run.pretrain.checkpoints
    if not (path / checkpoint_lib.MANIFEST).is_file():
        # a step named explicitly gets the same check as the latest one: no manifest, no export
        raise UserError(
            f"checkpoint {path} is not committed: it has no {checkpoint_lib.MANIFEST}, so its "
            "save did not finish (or the folder was damaged) and its files cannot be checked",
            fix="export a committed step with --checkpoint STEP "
            f"(committed: {_committed_steps(root) or 'none yet'})",
        )
    problem = checkpoint_lib.verify(path)
    if problem:
        raise UserError(
            f"checkpoint {path} is damaged: {problem}",
            fix="export an older step with --checkpoint STEP",
        )
    return path


def _locate_checkpoint(run: RunDir, checkpoint: str | None) -> Path:
    root = run.pretrain.checkpoints
    if checkpoint is None:
        latest = checkpoint_lib.latest(root)
        if latest is None:
            _no_committed_checkpoint(run)
        return latest
    text = str(checkpoint).strip()
    if text.isdigit():
        path = checkpoint_lib.step_dir(root, int(text))
        if not (path / checkpoint_lib.TRAINER_STATE).is_file():
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
    uncommitted = [p.name for p in checkpoint_lib.uncommitted(root)]
    if not uncommitted:
        raise UserError(
            f"no checkpoint to export in {root}", fix=f"run `hanlm pretrain --run {run_dir}` first"
        )
    # a finished pretraining is skipped when run again: only --force trains (and saves) anew
    force = " --force" if stage_fingerprint(run.pretrain.root) is not None else ""
    raise UserError(
        f"no committed checkpoint to export in {root}: {', '.join(uncommitted)} "
        f"{'has' if len(uncommitted) == 1 else 'have'} no {checkpoint_lib.MANIFEST}, so the "
        "save did not finish or the folder was damaged, and its files cannot be trusted",
        fix=f"put back a complete copy of a checkpoint (with its {checkpoint_lib.MANIFEST}), or "
        f"train again with `hanlm pretrain --run {run_dir}{force}`, which commits new ones",
    )


def _committed_steps(root: Path) -> str:
    """The steps of the committed checkpoints (those with a manifest), as a list for messages."""
    steps = (p.name.removeprefix("step-") for p in checkpoint_lib.committed(root))
    return ", ".join(str(int(step)) for step in steps if step.isdigit())


def _previous_record(out: Path) -> dict:
    try:
        return read_json(out / export.RECORD) if (out / export.WEIGHTS).is_file() else {}
    except (OSError, ValueError):
        return {}


def run(
    cfg: Config,
    run: RunDir | Path,
    *,
    force: bool = False,
    checkpoint: str | None = None,
    out: Path | None = None,
) -> dict:
    """Export a run's pretraining checkpoint (the latest by default) to its pretrain/hf folder."""
    run = RunDir(run) if not isinstance(run, RunDir) else run
    source = resolve_checkpoint(run, checkpoint)
    user_named_out = out
    out = Path(out) if out is not None else run.pretrain.export
    tokenizer_dir = tokenizer_stage.finished_path(run.root).parent
    manifest = shards_stage.load_manifest(run.root)
    config = model_config(
        cfg.model.preset, vocab_size=manifest["vocab_size"], seq_len=cfg.pretrain.seq_len
    )
    fp = export.export_fingerprint(source, config, tokenizer_dir, None, torch.float32)
    previous = _previous_record(out)
    if not force and previous.get("fingerprint") == fp:
        info(f"export: {out} already holds {source.name}, skipped")
        return {**_summary(previous, out), "skipped": True}
    started = time.perf_counter()
    # the run's own export folder is hanlm's to update; a folder the user named needs --force
    export.export_checkpoint(
        source,
        out,
        model_config=config,
        tokenizer_dir=tokenizer_dir,
        replace_earlier=force or user_named_out is None,
    )
    record = read_json(out / export.RECORD)
    info(f"export: {source.name} ({record['tokens']:,} tokens seen) -> {out}")
    return {
        **_summary(record, out),
        "skipped": False,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _summary(record: dict, out: Path) -> dict:
    keys = ("source_checkpoint", "step", "tokens", "model_sha256", "dtype")
    return {"out": str(out), **{k: record.get(k) for k in keys}}
