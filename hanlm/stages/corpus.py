"""The corpus stage: the configured inputs cleaned into `RUN/corpus/` (see hanlm.data.cleaning).

The stage's jobs work in `RUN/corpus.work/`, kept while the settings and inputs stay the same:
a run killed part-way resumes there, redoing only the tasks that had not finished (see
stages/data_jobs.py).
"""

from __future__ import annotations

from hanlm.config import Config
from hanlm.console import info
from hanlm.data import cleaning, corpus, dataset_repo, read_plan, readers
from hanlm.data.corpus import CorpusStats
from hanlm.stages import data_jobs
from hanlm.stages.run_facts import ENGINE_PLACEMENT
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> list:
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
    work = ctx.work  # Stage.work, made ready by the pipeline
    stats = data_jobs.run_jobs(
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


STAGE = Stage(
    name="corpus",
    version=3,  # 3: near-duplicates on folded text (punctuation, case)
    output=lambda run: run.corpus,
    result=CorpusStats,
    reads=("corpus", "data_engine", "run.seed"),
    unfingerprinted=ENGINE_PLACEMENT,
    work=lambda run: run.corpus_work,
    uses_demo=lambda cfg, options: any(map(readers.is_demo, cfg.corpus.all_inputs())),
    derived=read_plan.needed_characters,  # how far each source is read: pretraining's budget,
    build=build,
    inputs=inputs,
    damage=damage,
)
