"""What the stages read of each other's finished outputs, in one place.

A stage module never imports another: whether a stage has finished, which corpus training
reads, the run's tokenizer, its shard manifest, its decontamination index and the model it
trains are asked here, each with the UserError that says which stage to run when it is
missing or damaged. The settings that change nothing a training computes live here too, since
pretraining and SFT both leave them out of their fingerprints.
"""

from __future__ import annotations

from pathlib import Path

from hanlm.data import corpus, shards
from hanlm.data import tokenizer as tokenizer_lib
from hanlm.data.decontam import outputs as decontam_outputs
from hanlm.data.decontam.index import BenchmarkIndex
from hanlm.errors import UserError
from hanlm.files import file_sha256
from hanlm.stages.markers import stage_fingerprint
from hanlm.stages.rundir import RunDir, finished_output

# How many data-engine tasks run at once and where changes nothing a data stage writes (the
# tasks themselves, from task_mb, do).
ENGINE_PLACEMENT = tuple(f"data_engine.{k}" for k in ("executor", "workers", "slurm", "ray"))

# What changes nothing a training computes: where it runs, how it logs and keeps checkpoints
# (SFT's too).
TRAINING_BOOKKEEPING = (
    "parallel.device", "parallel.timeout_s",
    "checkpoint.resume", "checkpoint.every_minutes", "checkpoint.async_save",
    "checkpoint.keep_last", "checkpoint.keep_every", "checkpoint.retries", "checkpoint.backoff_s",
    "checkpoint.max_consecutive_failures", "checkpoint.timeout_s", "checkpoint.mirror",
    "logging.log_every", "logging.trackers", "logging.name", "logging.wandb", "logging.trackio",
)  # fmt: skip


def finished(run: RunDir | Path, stage: str) -> bool:
    """Whether stage `stage`'s folder in the run is marked complete."""
    return stage_fingerprint(RunDir.of(run).stage(stage)) is not None


# --- the corpus ---------------------------------------------------------------------------------


def training_corpus_dir(run: RunDir | Path) -> Path:
    """The corpus later stages train on: the decontaminated one when that stage wrote one."""
    run = RunDir.of(run)
    if finished(run, "decontam") and run.decontam_corpus.is_dir():
        return run.decontam_corpus
    if not finished(run, "corpus"):
        raise UserError(
            f"no finished corpus in {run.corpus}", fix=f"run `hanlm corpus --run {run.root}` first"
        )
    return run.corpus


def checked_corpus(run: RunDir | Path, corpus_dir: Path) -> Path:
    """`corpus_dir` (the run's corpus or its decontaminated copy) once its parts match the
    sizes and sha256 recorded when they were written; a stage about to read it all gets a
    UserError naming the damage and the stage that makes the folder again otherwise."""
    run = RunDir.of(run)
    problems = corpus.damaged_parts(corpus_dir)
    if problems:
        owner = "corpus" if Path(corpus_dir) == run.corpus else "decontam"
        raise UserError(
            f"{corpus_dir}, the output of the {owner} stage, is damaged ({'; '.join(problems[:3])})",
            fix=f"make it again: `hanlm run --run {run.root}` checks every finished stage and "
            f"redoes the damaged ones, or `hanlm {owner} --run {run.root} --force`",
        )
    return Path(corpus_dir)


def decontam_index(run: RunDir | Path) -> BenchmarkIndex | None:
    """The index the run's decontam stage saved, or None when the run has no decontam output."""
    run = RunDir.of(run)
    path = run.decontam_index
    if not finished(run, "decontam") or not path.is_file():
        return None
    problems = decontam_outputs.damaged_index(path)
    if problems:
        raise UserError(
            f"the run's decontamination index is damaged: {problems[0]}",
            where=str(path),
            fix=f"run `hanlm decontam --run {run.root}` again (it scans anew when its output is "
            "damaged)",
        )
    return BenchmarkIndex.load(path)


# --- the tokenizer and the shards ---------------------------------------------------------------


def tokenizer_path(run: RunDir | Path) -> Path:
    """The run's tokenizer.json; a UserError when the tokenizer stage has not finished."""
    run = RunDir.of(run)
    fix = f"run `hanlm tokenizer --run {run.root}` first"
    return finished_output(run.tokenizer_json, "tokenizer", fix)


def tokenizer(run: RunDir | Path):
    """The run's trained tokenizer as a `tokenizers.Tokenizer`."""
    return tokenizer_lib.load(tokenizer_path(run))


def shards_manifest(run: RunDir | Path) -> shards.ShardsManifest:
    """The run's shard manifest; a UserError when the shards were made with another tokenizer
    than the run's (the token ids would mean other text)."""
    run = RunDir.of(run)
    path = finished_output(run.shards_manifest, "shards", f"run `hanlm shards --run {run.root}`")
    manifest = shards.ShardsManifest.read(
        path, fix=f"make them again with `hanlm shards --run {run.root} --force`"
    )
    made_with = manifest.tokenizer_sha256
    sha = file_sha256(tokenizer_path(run))
    if made_with != sha:
        raise UserError(
            f"the shards in {run.shards} were made with another tokenizer (sha256 "
            f"{str(made_with)[:12]}…) than the run's ({sha[:12]}…)",
            fix=f"make them again with `hanlm shards --run {run.root}` (or `hanlm run --from "
            "tokenizer`)",
        )
    return manifest


def check_shards_intact(run: RunDir | Path) -> None:
    """Before training reads them: the token files match the sizes and sha256 recorded when
    they were written (a flipped token id would otherwise surface as an index error deep in
    the model); a UserError naming the damage and the rebuild otherwise."""
    run = RunDir.of(run)
    problems = shards.damaged_outputs(run.shards)
    if problems:
        raise UserError(
            f"the shards in {run.shards} are damaged ({'; '.join(problems[:3])})",
            fix=f"make them again: `hanlm run --run {run.root}` checks every finished stage and "
            f"redoes the damaged ones, or `hanlm shards --run {run.root} --force`",
        )


# --- the model ----------------------------------------------------------------------------------


def model_config(model_section, run: RunDir | Path, *, seq_len: int):
    """The model the run trains ([model]) for its tokenizer's vocabulary (the shard
    manifest's), at context `seq_len`."""
    from hanlm.model import run_model_config  # deferred: torch, for the stages that train

    manifest = shards_manifest(run)
    return run_model_config(model_section, vocab_size=manifest.vocab_size, seq_len=seq_len)
