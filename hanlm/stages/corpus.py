"""The corpus stage: the configured inputs cleaned into `RUN/corpus/` (see hanlm.data.cleaning).

The stage's jobs work in `RUN/corpus.work/`, kept while the settings and inputs stay the same:
a run killed part-way resumes there, redoing only the tasks that had not finished (see
stages/engine_output.py).
"""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.data import cleaning, corpus, readers
from hanlm.errors import UserError
from hanlm.files import (
    atomic_write_json,
    fingerprint,
    read_json,
    stage_fingerprint,
)
from hanlm.stages import engine_output
from hanlm.stages.demo import ensure_demo_world, world_settings
from hanlm.stages.rundir import RunDir

STAGE = "corpus"


def stage_fp(cfg: Config) -> str:
    sources = readers.expand_inputs(cfg.corpus.inputs)
    demo_cfg = world_settings(cfg) if "demo" in cfg.corpus.inputs else None
    return fingerprint(
        STAGE,
        cleaning.fingerprint_settings(cfg.corpus),
        cfg.data_engine.task_mb,  # the tasks decide the order of the output
        demo_cfg,
        cfg.run.seed,
        readers.input_fingerprint(sources),
    )


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict | None:
    """The corpus's stats; None when its jobs were submitted to a cluster and still run."""
    run = RunDir.of(run)
    out = run.corpus
    fp = stage_fp(cfg)
    if not force and stage_fingerprint(out) == fp:
        problems = corpus.damaged_parts(out)
        if not problems:
            info(f"corpus: up to date in {out}, skipped")
            engine_output.remove_leftover_work(STAGE, run.corpus_work)
            return read_json(run.corpus_stats)
        warn(f"corpus: {out} is damaged ({'; '.join(problems[:3])}); building it again")

    c = cfg.corpus
    sources = readers.expand_inputs(c.inputs)
    demo_file = None
    if "demo" in sources:
        ensure_demo_world(cfg, run)
        demo_file = run.demo_file("pretrain")
    work = engine_output.work_folder(run.corpus_work, fp, force=force)

    def make(tmp: Path) -> dict | None:
        stats = cleaning.build(
            sources, c, cfg.run.seed, cfg.data_engine, work, tmp, demo_file=demo_file
        )
        if stats is not None:
            atomic_write_json(tmp / corpus.STATS_FILE, stats)
        return stats

    result = engine_output.build(STAGE, out, work, fp, make, what="corpus")
    if result is None:
        return None
    corpus.warn_skipped(result)
    info(
        f"corpus: {result['documents_out']:,} documents, {result['characters_out']:,} characters "
        f"({result['exact_duplicates']:,} exact and {result['near_duplicates'] or 0:,} near duplicates "
        f"removed) -> {out}"
    )
    return result


def training_corpus_dir(run: RunDir | Path) -> Path:
    """The corpus later stages train on: the decontaminated one when that stage has run."""
    run = RunDir.of(run)
    if stage_fingerprint(run.decontam) is not None and run.decontam_corpus.is_dir():
        return run.decontam_corpus
    if stage_fingerprint(run.corpus) is None:
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
