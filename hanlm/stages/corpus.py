"""The corpus stage: the configured inputs cleaned into `RUN/corpus/` (see hanlm.data.cleaning).

The stage's jobs work in `RUN/corpus.work/`, kept while the settings and inputs stay the same:
a run killed part-way resumes there, redoing only the tasks that had not finished (see
stages/engine_output.py).
"""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.data import cleaning, corpus, dataset_repo, read_plan, readers
from hanlm.data.corpus import CorpusStats
from hanlm.errors import UserError
from hanlm.files import stage_fingerprint
from hanlm.stages import engine_output
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import Stage, StageContext

# how many run at once and where changes nothing the corpus holds (the tasks, from task_mb, do)
ENGINE_PLACEMENT = tuple(f"data_engine.{k}" for k in ("executor", "workers", "slurm", "ray"))

STAGE = Stage(
    name="corpus",
    version=3,  # 3: near-duplicates on folded text (punctuation, case)
    output=lambda run: run.corpus,
    result=CorpusStats,
    reads=("corpus", "data_engine", "run.seed"),
    unfingerprinted=ENGINE_PLACEMENT,
    work=lambda run: run.corpus_work,
    uses_demo=lambda cfg, options: any(map(readers.is_demo, cfg.corpus.all_inputs())),
    derived=read_plan.needed_characters,  # how far each source is read: pretraining's budget
)


def inputs(cfg: Config, run: RunDir, options: dict) -> list:
    """The input files by path, size and time (too large to read just to see they are the same;
    the demo world is the demo stage's, by its fingerprint), the commit each local snapshot
    of a Hub dataset was downloaded at, and the URL blocklist's domains."""
    sources = [
        [
            spec.name,
            readers.input_fingerprint(readers.expand_inputs(spec.inputs)),
            dataset_repo.input_revisions(spec.inputs),
        ]
        for spec in cfg.corpus.source_list()
    ]
    blocklist = cfg.corpus.url_blocklist
    return [*sources, sorted(cleaning.read_url_blocklist(blocklist)) if blocklist else None]


def damage(run: RunDir) -> str | None:
    problems = corpus.damaged_parts(run.corpus)
    return "; ".join(problems[:3]) if problems else None


def build(ctx: StageContext) -> CorpusStats | None:
    """The corpus's stats; None when its jobs were submitted to a cluster and still run."""
    cfg, run = ctx.cfg, ctx.run
    demo = any(map(readers.is_demo, cfg.corpus.all_inputs()))
    demo_file = run.demo_file("pretrain") if demo else None
    work = engine_output.work_folder(run.corpus_work, ctx.fingerprint, force=ctx.force)
    stats = engine_output.run_jobs(
        "corpus", work, lambda: cleaning.build(
            cfg.corpus, cfg.run.seed, cfg.data_engine, work, ctx.out, needs=ctx.derived,
            demo_file=demo_file,
        ), what="corpus",
    )  # fmt: skip
    if stats is None:
        return None
    stats = CorpusStats.model_validate(stats)
    corpus.warn_skipped(stats)
    info(
        f"corpus: {stats.documents_out:,} documents, {stats.characters_out:,} characters "
        f"({stats.exact_duplicates:,} exact and {stats.near_duplicates or 0:,} near "
        f"duplicates removed) -> {run.corpus}"
    )
    return stats


def training_corpus_dir(run: RunDir | Path) -> Path:
    """The corpus later stages train on: the decontaminated one when that stage wrote one."""
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
