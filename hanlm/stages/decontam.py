"""The decontam stage: the run's corpus (or, standalone, any training data) scanned against the
benchmarks, in one pass or as shards merged later.

The benchmark items, each with the prompt lm-eval scores as a form to look for too, are built
here (from hanlm.testsets and hanlm.evals.tasks) and handed to hanlm.data.decontam, which knows
nothing of evaluation. Outputs: see hanlm.data.decontam.outputs.

Options (`pipeline.run_stage("decontam", ..., **options)`, from `hanlm decontam`): the fields
of DecontamOptions.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.data import dataset_repo
from hanlm.data.corpus import corpus_parts, damaged_parts
from hanlm.data.decontam import outputs
from hanlm.data.decontam.index import BenchmarkIndex
from hanlm.data.decontam.scan import expand_corpus
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.evals.tasks import lm_eval_registry, with_prompt_form
from hanlm.files import file_sha256, fingerprint
from hanlm.stages import data_jobs
from hanlm.stages.run_facts import ENGINE_PLACEMENT, checked_corpus, finished
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import Stage, StageContext
from hanlm.testsets import readers


@dataclass(frozen=True)
class DecontamOptions:
    """What `hanlm decontam` asks of the stage beyond the recipe."""

    # scan the files of `corpus` (globs) into OUT/decontam/ (OUT: the run folder given), not a
    # run's corpus
    standalone: bool = False
    corpus: list[str] | None = None
    # (I, N): scan one share of the files into decontam-partial/ (never skipped, never marked
    # finished)
    shard: tuple[int, int] | None = None
    merge: bool = False  # combine every shard's partial result into decontam/ (never skipped)


def _uses_demo(cfg: Config, options: DecontamOptions) -> bool:
    if options.standalone:  # a benchmark of the demo world is refused there
        return False
    return any(spec.partition("=")[2].strip() == "demo" for spec in cfg.decontam.benchmarks)


# ---------------------------------------------------------------------------------------------
# Benchmarks


def benchmark_specs(specs: list[str], demo_benchmark: Path | None) -> list[tuple[str, Path | None]]:
    """TASK=PATH specs -> (task, file); PATH `demo` is the run's demo world benchmark
    (`demo_benchmark`, None outside a run), an `hf:` id a local copy of that split (the Hub's
    or a snapshot's rows, as eval reads them: `kobest_boolq=hf:skt/kobest_v1:boolq:test`). A
    task or group of lm-evaluation-harness's registry (`kmmlu`, `haerae=DIR`) gives its tasks,
    each with its local copy's folder (None: the Hub); a task file (`exam.toml`) its items."""
    out: list[tuple[str, Path | None]] = []
    for spec in specs:
        name = spec.partition("=")[0].strip()
        if name.lower().endswith(tasks_lib.TASK_FILE_SUFFIXES) or (
            name not in readers.BENCHMARKS and lm_eval_registry.is_lm_eval_name(name)
        ):
            for leaf in tasks_lib.expand_specs([spec])[0]:
                task, source = tasks_lib.parse_task_spec(leaf)
                out.append((task, Path(source).expanduser() if source else None))
            continue
        task, path = readers.parse_spec(spec)
        if path == "demo":
            if demo_benchmark is None:
                raise UserError(
                    f"benchmark {spec!r} names the demo world, which only a run has",
                    fix="use --run DIR, or give the file: `hanlm demo --out D` writes "
                    "D/benchmark.jsonl",
                )
            out.append((task, demo_benchmark))
        elif dataset_repo.is_hf_id(path):  # the Hub's columns, read as eval reads them
            out.append((task, dataset_repo.local_copy(path)))
        else:
            out.append((task, Path(path).expanduser()))
        if not out[-1][1].is_file():
            raise UserError(
                f"benchmark file for {task} not found: {out[-1][1]}",
                where=spec,
                fix=f"get it from {readers.WHERE_TO_GET[task]}",
            )
    if not out:
        raise UserError(
            "no benchmarks to decontaminate against",
            fix="pass --benchmark TASK=PATH (repeatable) or set decontam.benchmarks",
        )
    return out


def load_items(benchmarks: list[tuple[str, Path | None]], text_field: str) -> list[readers.Item]:
    """Every benchmark item, with the prompt lm-eval scores as a form to look for too."""
    items: list[readers.Item] = []
    for task, path in benchmarks:
        if task not in readers.BENCHMARKS:  # lm-eval's: its test documents, read by lm-eval
            items += _task_items(task, str(path) if path is not None else None)
            continue
        items.extend(
            with_prompt_form(item) for item in readers.read(task, path, text_field=text_field)
        )
    return items


@functools.cache
def _task_items(task: str, source: str | None) -> tuple[readers.Item, ...]:
    """An lm-eval task's (or task file's) items, read once a process: the stage's inputs
    (its fingerprint) and its scan both need them, and a Hub data set is not read twice."""
    return tuple(tasks_lib.get(task).load(source, demo_files=None, options=tasks_lib.Options()))


def _benchmark_identity(task: str, path: Path | None) -> list:
    """A benchmark file by content; an lm-eval task's documents by their text (read from its
    local copy, or the Hub)."""
    if task in readers.BENCHMARKS:
        return [task, file_sha256(path)]
    items = load_items([(task, path)], "text")
    return [task, fingerprint([[i.item_id, i.overlap_text, i.forms] for i in items])]


def _file_key(path: Path) -> list:
    """A corpus file by path, size and time: too large to read just to see it is unchanged."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _check_thresholds(cfg: Config) -> None:
    decontam = cfg.decontam
    if not decontam.clean_threshold <= decontam.dirty_threshold:
        raise UserError(
            f"decontam.clean_threshold {decontam.clean_threshold} is above decontam.dirty_threshold "
            f"{decontam.dirty_threshold}",
            fix="keep clean_threshold <= dirty_threshold",
        )


def not_needed(cfg: Config) -> str | None:
    if not cfg.decontam.enabled:
        return "disabled; training reads the corpus as it is"
    if not cfg.decontam.benchmarks:
        return "no decontam.benchmarks configured; training reads the corpus as it is"
    return None


def validate(cfg: Config, run: RunDir, options: DecontamOptions) -> None:
    """Thresholds that contradict each other, and a run's scan without a finished corpus."""
    _check_thresholds(cfg)
    if options.standalone or options.merge:
        return
    if not finished(run, "corpus"):
        raise UserError(
            f"no finished corpus in {run.corpus}", fix=f"run `hanlm corpus --run {run.root}` first"
        )


def _benchmarks(
    cfg: Config, run: RunDir, options: DecontamOptions
) -> list[tuple[str, Path | None]]:
    return benchmark_specs(
        cfg.decontam.benchmarks, None if options.standalone else run.demo_file("benchmark")
    )


def inputs(cfg: Config, run: RunDir, options: DecontamOptions) -> list | None:
    """The benchmark files by content (small; the demo world's lives in the run, so a run folder
    moved elsewhere stays up to date) and, standalone, the scanned files by path, size, time.
    A merge takes what its partial results were scanned from (they were checked alike)."""
    if options.merge:
        return None
    benchmarks = [_benchmark_identity(task, path) for task, path in _benchmarks(cfg, run, options)]
    scanned = [_file_key(path) for path in expand_corpus(options.corpus)] if options.corpus else []
    return [benchmarks, scanned]


def always_builds(options: DecontamOptions) -> bool:
    """One shard of a scan (which makes only part of the output, never marked finished) and a
    merge of the shards' scans are built whatever the stage's folder holds."""
    return options.shard is not None or options.merge


def damage(run: RunDir) -> str | None:
    problems = damaged_parts(run.decontam_corpus) + outputs.damaged_index(run.decontam_index)
    return "; ".join(problems[:3]) if problems else None


def build(ctx: StageContext) -> outputs.DecontamReport | None:
    """Scan (or merge the shards' scans) into the stage's folder; None for one shard's partial
    scan, or when the jobs were submitted to a cluster (Slurm) and still run."""
    cfg, run, options = ctx.cfg, ctx.run, ctx.options
    standalone = options.standalone
    if options.merge:
        report = _merge(ctx, corpus_dir=None if standalone else run.corpus)
    else:
        if standalone:
            files, corpus_dir = expand_corpus(options.corpus), None
        else:
            corpus_dir = run.corpus
            files = corpus_parts(checked_corpus(run, corpus_dir))
        benchmarks = _benchmarks(cfg, run, options)
        mode = "standalone" if standalone else "run"
        report = _scan(ctx, benchmarks, files, options.shard, corpus_dir, mode)
    if report is not None:
        info(f"decontam: report in {run.decontam / 'report.md'}")
    return report


def _scan(
    ctx: StageContext, benchmarks, files, shard, corpus_dir, mode: str
) -> outputs.DecontamReport | None:
    """Index, scan, then either save this shard's partial result (None: not finished) or write
    the outputs.

    The data engine works in DIR/decontam-partial/scan/ (a shard's in scan-I-of-N/), kept while
    the settings stay the same: a scan killed part-way redoes only its unfinished tasks."""
    cfg, layout = ctx.cfg, ctx.run
    partial_dir = layout.decontam_partial
    items = load_items(benchmarks, cfg.decontam.text_field)
    index = BenchmarkIndex.build(items, ngram=cfg.decontam.ngram)
    partial_dir.mkdir(parents=True, exist_ok=True)
    index_path = partial_dir / outputs.INDEX_FILE
    index.save(index_path)
    name = "scan" if shard is None else f"scan-{shard[0]:04d}-of-{shard[1]:04d}"
    # the tasks come from the files and the task size: a change of either starts afresh
    work = data_jobs.work_folder(
        partial_dir / name, fingerprint(ctx.fingerprint, shard), force=ctx.force
    )

    def make():
        result = outputs.scan_files(cfg, index, index_path, files, shard, work)
        if result is None:
            return None  # submitted to Slurm
        if shard is not None:
            outputs.save_partial(partial_dir, result, shard, ctx.fingerprint)
            return _PARTIAL
        return outputs.finish(
            ctx.out, index, result, cfg, corpus_dir=corpus_dir, meta={"mode": mode}, work=work,
            index_path=index_path,
        )  # fmt: skip

    report = data_jobs.run_jobs("decontam", work, make, what="results")
    if report is _PARTIAL:
        shutil.rmtree(work, ignore_errors=True)
        return None
    if report is not None:
        shutil.rmtree(partial_dir, ignore_errors=True)
    return report


_PARTIAL = object()  # one shard's scan saved: nothing to report until the merge


def _merge(ctx: StageContext, *, corpus_dir: Path | None) -> outputs.DecontamReport | None:
    """Combine every shard's partial result in DIR/decontam-partial/ into the stage's folder.

    Each `--shard I/N` run writes shard-I-of-N.{npz,json} and index.npz there; on machines that
    do not share DIR, copy every shard's files into one DIR/decontam-partial/ first."""
    partial_dir = ctx.run.decontam_partial
    index, result, fp, n = outputs.load_partials(partial_dir)
    meta = {"mode": "run" if corpus_dir is not None else "standalone", "shards": n}
    work = data_jobs.work_folder(partial_dir / "merge", fingerprint(fp, n), force=False)

    def make():
        return outputs.finish(
            ctx.out, index, result, ctx.cfg, corpus_dir=corpus_dir, meta=meta, work=work,
            index_path=partial_dir / outputs.INDEX_FILE,
        )  # fmt: skip

    report = data_jobs.run_jobs("decontam", work, make, what="results")
    if report is not None:
        shutil.rmtree(partial_dir, ignore_errors=True)
    return report


STAGE = Stage(
    name="decontam",
    version=3,  # 3: contamination by corpus source (2: index format 2)
    output=lambda run: run.decontam,
    result=outputs.DecontamReport,
    options=DecontamOptions,
    reads=("decontam", "corpus.min_chars", "data_engine"),
    # whether it runs, how its text is batched, and what the compare stage does change no output
    unfingerprinted=(
        "decontam.enabled",
        "decontam.batch_bytes",
        "decontam.compare_drop",
        *ENGINE_PLACEMENT,
    ),
    after=("corpus",),
    uses_demo=_uses_demo,
    build=build,
    not_needed=not_needed,
    validate=validate,
    inputs=inputs,
    damage=damage,
    always_builds=always_builds,
)
