"""The decontam stage (`--run`), the standalone scan (`--corpus --out`), shards and merge.

The benchmark items, each with the prompt lm-eval scores as a form to look for too, are built
here (from hanlm.testsets and hanlm.evals.tasks) and handed to hanlm.data.decontam, which knows
nothing of evaluation. Outputs: see hanlm.data.decontam.outputs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.data import engine
from hanlm.data.corpus import corpus_parts, damaged_parts
from hanlm.data.decontam import outputs
from hanlm.data.decontam.index import FORMAT_VERSION, BenchmarkIndex
from hanlm.data.decontam.scan import expand_corpus
from hanlm.errors import UserError
from hanlm.evals.tasks import with_prompt_form
from hanlm.files import file_sha256, fingerprint, read_json, stage_fingerprint
from hanlm.stages.corpus import checked_corpus
from hanlm.stages.demo import ensure_demo_world
from hanlm.stages.rundir import RunDir
from hanlm.testsets import readers

STAGE = outputs.STAGE


# ---------------------------------------------------------------------------------------------
# Benchmarks


def benchmark_specs(specs: list[str], demo_benchmark: Path | None) -> list[tuple[str, Path]]:
    """TASK=PATH specs -> (task, file); PATH `demo` is the run's demo world benchmark
    (`demo_benchmark`, None outside a run)."""
    out = []
    for spec in specs:
        task, path = readers.parse_spec(spec)
        if path == "demo":
            if demo_benchmark is None:
                raise UserError(
                    f"benchmark {spec!r} names the demo world, which only a run has",
                    fix="use --run DIR, or give the file: `hanlm demo --out D` writes "
                    "D/benchmark.jsonl",
                )
            out.append((task, demo_benchmark))
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


def load_items(benchmarks: list[tuple[str, Path]], text_field: str) -> list[readers.Item]:
    """Every benchmark item, with the prompt lm-eval scores as a form to look for too."""
    items: list[readers.Item] = []
    for task, path in benchmarks:
        items.extend(with_prompt_form(i) for i in readers.read(task, path, text_field=text_field))
    return items


def _file_key(path: Path) -> list:
    """A corpus file by path, size and time: too large to read just to see it is unchanged."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _benchmark_key(path: Path) -> str:
    """A benchmark file by its content: small, and the demo world's lives inside the run, so a
    run directory moved or copied elsewhere (new path, new times) is still up to date."""
    return file_sha256(path)


def _check_thresholds(cfg: Config) -> None:
    d = cfg.decontam
    if not d.clean_threshold <= d.dirty_threshold:
        raise UserError(
            f"decontam.clean_threshold {d.clean_threshold} is above decontam.dirty_threshold "
            f"{d.dirty_threshold}",
            fix="keep clean_threshold <= dirty_threshold",
        )


def _fp(cfg: Config, benchmarks, inputs: list) -> str:
    d = cfg.decontam.model_dump(exclude={"batch_bytes", "enabled"})
    return fingerprint(
        STAGE,
        FORMAT_VERSION,
        d,
        cfg.corpus.min_chars,
        [[t, _benchmark_key(p)] for t, p in benchmarks],
        inputs,
    )


# ---------------------------------------------------------------------------------------------
# Entry points


def run(
    cfg: Config, run: RunDir | Path, *, force: bool = False, shard: tuple[int, int] | None = None
) -> dict | None:
    """The stage between corpus and tokenizer: scan the run's corpus, write RUN/decontam/; the
    report, or None when its jobs were submitted to a cluster (Slurm) and still run."""
    run = RunDir.of(run)
    out = run.decontam
    if not cfg.decontam.enabled or not cfg.decontam.benchmarks:
        # A finished earlier output would otherwise be trained on; anything else there is not
        # hanlm's to delete (and, with no stage marker, is never read as a decontaminated corpus).
        if stage_fingerprint(out) is not None:
            shutil.rmtree(out)
        why = "disabled" if not cfg.decontam.enabled else "no decontam.benchmarks configured"
        info(f"decontam: {why}; training reads {run.corpus}")
        return {"enabled": False}
    _check_thresholds(cfg)
    corpus_dir = run.corpus
    corpus_fp = stage_fingerprint(corpus_dir)
    if corpus_fp is None:
        raise UserError(
            f"no finished corpus in {corpus_dir}", fix=f"run `hanlm corpus --run {run.root}` first"
        )
    if any(readers.parse_spec(spec)[1] == "demo" for spec in cfg.decontam.benchmarks):
        ensure_demo_world(cfg, run)  # there already when the corpus came from the demo
    benchmarks = benchmark_specs(cfg.decontam.benchmarks, run.demo_file("benchmark"))
    fp = _fp(cfg, benchmarks, [corpus_fp])
    if shard is None and not force and stage_fingerprint(out) == fp:
        problems = damaged_parts(run.decontam_corpus) + outputs.damaged_index(run.decontam_index)
        if not problems:
            info(f"decontam: up to date in {out}, skipped")
            return read_json(run.decontam_report)
        warn(
            f"decontam: {run.decontam_corpus} is damaged ({'; '.join(problems[:3])}); scanning again"
        )

    files = corpus_parts(checked_corpus(run, corpus_dir))
    return _scan(cfg, benchmarks, files, run, fp, shard, corpus_dir, "run", force)


def standalone(
    cfg: Config,
    corpus: list[str],
    out_dir: Path,
    *,
    force: bool = False,
    shard: tuple[int, int] | None = None,
) -> dict | None:
    """Scan any training data (`--corpus` globs) against the benchmarks into OUT/decontam/
    (None: submitted to a cluster, as `run`)."""
    _check_thresholds(cfg)
    files = expand_corpus(corpus)
    benchmarks = benchmark_specs(cfg.decontam.benchmarks, None)
    layout = RunDir(out_dir)  # OUT/ holds decontam/ and decontam-partial/ as a run would
    out = layout.decontam
    fp = _fp(cfg, benchmarks, [_file_key(f) for f in files])
    if shard is None and not force and stage_fingerprint(out) == fp:
        info(f"decontam: up to date in {out}, skipped")
        return read_json(layout.decontam_report)
    return _scan(cfg, benchmarks, files, layout, fp, shard, None, "standalone", force)


def _scan(cfg, benchmarks, files, layout: RunDir, fp: str, shard, corpus_dir, mode: str,
          force: bool = False):  # fmt: skip
    """Index, scan, then either save this shard's partial result or finish the reports.

    The data engine works in DIR/decontam-partial/scan/ (a shard's in scan-I-of-N/), kept while
    the settings stay the same: a scan killed part-way redoes only its unfinished tasks."""
    partial = layout.decontam_partial
    items = load_items(benchmarks, cfg.decontam.text_field)
    index = BenchmarkIndex.build(items, ngram=cfg.decontam.ngram)
    partial.mkdir(parents=True, exist_ok=True)
    index_path = partial / outputs.INDEX_FILE
    index.save(index_path)
    name = "scan" if shard is None else f"scan-{shard[0]:04d}-of-{shard[1]:04d}"
    work_dir = partial / name
    if force and work_dir.exists():
        shutil.rmtree(work_dir)
    # the tasks come from the files and the task size: a change of either starts afresh
    work = engine.prepare_work_dir(work_dir, fingerprint(fp, shard, cfg.data_engine.task_mb))
    try:
        result = outputs.scan_files(cfg, index, index_path, files, shard, work)
        if result is None:
            raise outputs.Submitted
        if shard is not None:
            report = outputs.save_partial(partial, result, shard, fp)
            shutil.rmtree(work, ignore_errors=True)
            return report
        report = outputs.finish(
            layout.decontam, index, result, cfg, fp, corpus_dir=corpus_dir, meta={"mode": mode},
            work=work, index_path=index_path,
        )  # fmt: skip
    except outputs.Submitted:
        return _submitted(work)
    except UserError:
        shutil.rmtree(work, ignore_errors=True)  # the input must change before a retry
        raise
    shutil.rmtree(partial, ignore_errors=True)
    return report


def _submitted(work: Path) -> None:
    info(
        f"decontam: jobs submitted to Slurm (logs in {work / 'logs'}); run the same command "
        "again when they have finished to gather the results"
    )


def merge(cfg: Config, *, out_dir: Path | None = None, run_dir: Path | None = None) -> dict | None:
    """Combine every shard's partial result in DIR/decontam-partial/ into DIR/decontam/.

    Each `--shard I/N` run writes shard-I-of-N.{npz,json} and index.npz there; on machines that
    do not share DIR, copy every shard's files into one DIR/decontam-partial/ first."""
    layout = RunDir(run_dir if run_dir is not None else out_dir)
    partial = layout.decontam_partial
    index, result, fp, n = outputs.load_partials(partial)
    corpus_dir = layout.corpus if run_dir is not None else None
    meta = {"mode": "run" if run_dir is not None else "standalone", "shards": n}
    work = engine.prepare_work_dir(partial / "merge", fingerprint(fp, n))
    try:
        report = outputs.finish(
            layout.decontam, index, result, cfg, fp, corpus_dir=corpus_dir, meta=meta,
            work=work, index_path=partial / outputs.INDEX_FILE,
        )  # fmt: skip
    except outputs.Submitted:
        return _submitted(work)
    shutil.rmtree(partial, ignore_errors=True)
    return report


def load_run_index(run: RunDir | Path) -> BenchmarkIndex | None:
    """The index the run's decontam stage saved, or None when the run has no decontam output."""
    run = RunDir.of(run)
    path = run.decontam_index
    if stage_fingerprint(path.parent) is None or not path.is_file():
        return None
    problems = outputs.damaged_index(path)
    if problems:
        raise UserError(
            f"the run's decontamination index is damaged: {problems[0]}",
            where=str(path),
            fix=f"run `hanlm decontam --run {run.root}` again (it scans anew when its output is "
            "damaged)",
        )
    return BenchmarkIndex.load(path)
