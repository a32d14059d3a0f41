"""The sft stage: chat fine-tuning of the run's pretrained model (or `sft.model`) on the run's
demo conversations (or `sft.data`) into sft/; skipped when finished with the same settings,
source model and data. hanlm.train.sft does the work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hanlm.config import Config, SftSection
from hanlm.console import info, warn
from hanlm.data import chat_data
from hanlm.errors import UserError
from hanlm.files import (
    STAGE_MARKER,
    atomic_write_json,
    file_sha256,
    fingerprint,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.model import model_config
from hanlm.model_folder import check_model_folder, export_damage, is_model_folder
from hanlm.stages import shards as shards_stage
from hanlm.stages.decontam import load_run_index
from hanlm.stages.rundir import RunDir, SftDirs
from hanlm.train import checkpoint, trackers
from hanlm.train import sft as sft_lib

STAGE = "sft"
# the hard-coded schedule SFT had before [sft.optimizer]: fingerprints name it only when changed
_FORMER_SCHEDULE = {"schedule": "cosine", "decay_fraction": 0.2}


# --- the source model and the data -----------------------------------------------------------------


def source_of(cfg: Config, run: RunDir | None) -> sft_lib.SftSource:
    """Where SFT starts: `sft.model`, else the run's latest pretraining checkpoint, else its
    exported pretrain/hf."""
    if cfg.sft.model:
        path = check_model_folder(cfg.sft.model)  # its tokenizer is SFT's tokenizer
        return _hf_source(path, run)
    if run is None:
        raise UserError("SFT needs a run directory or --model HF_DIR")
    latest = checkpoint.latest(run.pretrain.checkpoints)
    if latest is not None:
        state = checkpoint.read_trainer_state(latest)
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


def _hf_source(path: Path, run: RunDir | None) -> sft_lib.SftSource:
    # the shard manifest's special-token counts only when the model was pretrained in this run
    counts = None if run is None or _outside(path, run.root) else _pretrain_counts(run)
    fp = _hf_fp(path, None if run is None or _outside(path, run.root) else run.root)
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
    shards = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.glob("*.safetensors")]
    return fingerprint(where, sorted(shards))


def _pretrain_counts(run: RunDir) -> dict[str, int] | None:
    if not run.shards_manifest.is_file():
        return None
    return read_json(run.shards_manifest).get("special_token_counts")


def _outside(path: Path, run_dir: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(run_dir).resolve())
        return False
    except ValueError:
        return True


def with_model_config(cfg: Config, source: sft_lib.SftSource, run: RunDir | None):
    """A checkpoint source with the model config to build for it (the run's model at SFT's
    length); a Hugging Face folder brings its own."""
    if source.kind != "checkpoint":
        return source
    manifest = shards_stage.load_manifest(run.root)
    seq_len = max(cfg.pretrain.seq_len, cfg.sft.seq_len)
    config = model_config(cfg.model.preset, vocab_size=manifest["vocab_size"], seq_len=seq_len)
    return dataclasses.replace(source, model_config=config)


def data_path(cfg: Config, run: RunDir | None) -> Path:
    if cfg.sft.data:
        return Path(cfg.sft.data)
    if run is None:
        raise UserError("no chat data", fix="give --data a messages JSONL file")
    return run.demo_file("chat")


# --- the stage ------------------------------------------------------------------------------------


def fingerprinted_settings(cfg: Config) -> tuple[dict, dict]:
    """SFT's settings and the shared ones it uses, under the names they had before the config
    was split by component, so that finished run directories stay recognised."""
    s, o = cfg.sft, cfg.sft.optimizer
    own = {
        **s.model_dump(exclude={"optimizer", "checkpoint", "logging", "min_closure"}),
        **o.model_dump(include={"lr", "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip"}),
        "eval_every": s.logging.eval_every,
        "eval_batches": s.logging.eval_batches,
        "checkpoint_every": s.checkpoint.every,
    }  # not resume, log_every or min_closure: they change nothing the training computes
    schedule = o.model_dump(include=set(_FORMER_SCHEDULE))
    if schedule != _FORMER_SCHEDULE:
        own["schedule"] = schedule
    shared = {
        "precision": cfg.precision.mode,
        "device": cfg.parallel.device,
        "parallel": cfg.parallel.mode,
        "beta1": o.beta1,
        "beta2": o.beta2,
        "eps": o.eps,
        "preset": cfg.model.preset,
    }
    if cfg.precision.mode in ("fp8", "fp8-emulate"):
        # fp8 runs only (others keep their fingerprints): SFT once trained fp8 settings in bf16,
        # and such a finished SFT is not this one
        shared["fp8_recipe"] = cfg.precision.fp8_recipe
    return own, shared


def stage_fp(cfg: Config, source: sft_lib.SftSource, data_fp: str) -> str:
    own, shared = fingerprinted_settings(cfg)
    return fingerprint(
        STAGE,
        own,
        shared,
        cfg.run.seed,
        source.fingerprint,
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


def run(
    cfg: Config, run: RunDir | Path | None, *, force: bool = False, out: Path | None = None
) -> dict:
    if run is not None and not isinstance(run, RunDir):
        run = RunDir(run)
    if out is None and run is None:
        raise UserError("SFT needs a run directory or an output folder")
    outputs = SftDirs(Path(out)) if out is not None else run.sft
    source = source_of(cfg, run)
    data_file = data_path(cfg, run)
    conversations = chat_data.read_conversations(data_file)
    data_fp = file_sha256(data_file)
    fp = stage_fp(cfg, source, data_fp)
    if not force and stage_fingerprint(outputs.root) == fp:
        problem = export_damage(outputs.export)
        if problem is None:
            info(f"sft: up to date in {outputs.root}, skipped")
            return read_json(outputs.summary)
        # its final checkpoint is kept: the run resumes there and only exports again
        warn(f"sft: the chat model in {outputs.export} is damaged ({problem}); making it again")
    trackers.check(cfg.logging)  # on every rank, before the model is loaded
    (outputs.root / STAGE_MARKER).unlink(missing_ok=True)
    outputs.root.mkdir(parents=True, exist_ok=True)

    index = load_run_index(run.root) if run is not None else None
    summary, main_check = sft_lib.fine_tune(
        cfg,
        source=with_model_config(cfg, source, run),
        conversations=conversations,
        data_file=data_file,
        data_fp=data_fp,
        index=index,
        outputs=outputs,
        settings_fp=fp,
        force=force,
    )
    if main_check is None:  # not rank 0
        return summary
    atomic_write_json(outputs.summary, summary)
    _gate(main_check, cfg.sft, outputs.closure)
    write_stage_marker(outputs.root, STAGE, fp)
    return summary
