"""`hanlm decontam`: the stage (`--run`), the standalone scan (`--corpus --out`), shards and merge.

Outputs in DIR/decontam/: index.npz (the benchmark index, reusable from Python), items.jsonl
(per item: benchmark, item_id, coverage, status, a few matching document ids), report.json,
report.md, flagged.jsonl (every document holding part of a dirty or partial item, and what was
done to it), and in `--run` mode corpus/: the decontaminated corpus in the corpus stage's format
(untouched parts hard-linked, not copied), which the tokenizer and shards stages then read.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hanlm.config import Config
from hanlm.console import info, progress, warn
from hanlm.data.decontam.index import FORMAT_VERSION, BenchmarkIndex
from hanlm.data.decontam.scan import ScanResult, expand_corpus, scan
from hanlm.errors import UserError
from hanlm.files import (
    atomic_output_dir,
    atomic_write_json,
    atomic_write_text,
    file_mismatch,
    file_record,
    fingerprint,
    open_text_stream,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.testsets import readers

STAGE = "decontam"
PARTIAL = "decontam-partial"
INDEX_FILE = "index.npz"


# ---------------------------------------------------------------------------------------------
# Benchmarks


def benchmark_specs(specs: list[str], run_dir: Path | None) -> list[tuple[str, Path]]:
    """TASK=PATH specs -> (task, file); PATH `demo` is the run's demo world benchmark."""
    out = []
    for spec in specs:
        task, path = readers.parse_spec(spec)
        if path == "demo":
            if run_dir is None:
                raise UserError(
                    f"benchmark {spec!r} names the demo world, which only a run has",
                    fix="use --run DIR, or give the file: `hanlm demo --out D` writes "
                    "D/benchmark.jsonl",
                )
            out.append((task, Path(run_dir) / "demo" / "benchmark.jsonl"))
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
    from hanlm.evals.tasks import with_prompt_form

    items: list[readers.Item] = []
    for task, path in benchmarks:
        items.extend(with_prompt_form(i) for i in readers.read(task, path, text_field=text_field))
    return items


def _file_key(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


# ---------------------------------------------------------------------------------------------
# From scan result to per-item and per-document outcomes


@dataclass
class Outcome:
    coverage: np.ndarray  # per item
    status: list[str]
    found_by: list[str | None]  # per item: "whole", "parts" or None (clean)
    item_docs: list[list[int]]  # per item: documents (indices into the scan) holding it, best first
    flagged: dict[int, set[int]]  # document -> non-clean items it holds part of


def decide(index: BenchmarkIndex, result: ScanResult, dirty: float, clean: float) -> Outcome:
    coverage, whole = index.item_coverage(result.found)
    status = [index.status(c, dirty=dirty, clean=clean) for c in coverage]
    found_by = [
        index.found_by(s, w, dirty=dirty, clean=clean) for s, w in zip(status, whole, strict=True)
    ]
    a = result.arrays()
    share = a["pair_count"] / np.maximum(index.pairs_per_item[a["pair_item"]], 1)
    order = np.lexsort((a["pair_doc"], -share, a["pair_item"]))
    item_docs: list[list[int]] = [[] for _ in range(len(index))]
    flagged: dict[int, set[int]] = {}
    for doc, item in zip(a["pair_doc"][order].tolist(), a["pair_item"][order].tolist(),
                         strict=True):  # fmt: skip
        item_docs[item].append(doc)
        if status[item] != "clean":
            flagged.setdefault(doc, set()).add(item)
    return Outcome(coverage, status, found_by, item_docs, flagged)


def write_reports(out: Path, index, result, outcome, cfg: Config, extra: dict) -> dict:
    d = cfg.decontam
    names = result.doc_names()
    lines = []
    for i in range(len(index)):
        row = {
            "benchmark": index.benchmarks[i],
            "item_id": index.item_ids[i],
            "coverage": round(float(outcome.coverage[i]), 4),
            "status": outcome.status[i],
            "found_by": outcome.found_by[i],
            "documents": [names[doc] for doc in outcome.item_docs[i][: d.max_documents]],
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    atomic_write_text(out / "items.jsonl", "\n".join(lines) + "\n" if lines else "")
    per_benchmark: dict[str, Counter] = {}
    for bench, status, how in zip(index.benchmarks, outcome.status, outcome.found_by,
                                  strict=True):  # fmt: skip
        counts = per_benchmark.setdefault(bench, Counter())
        counts[status] += 1
        counts[f"by_{how}"] += how is not None
    benchmarks = {
        b: {
            "items": sum(c[s] for s in ("dirty", "partial", "clean")),
            **{s: c[s] for s in ("dirty", "partial", "clean")},
            "found_whole": c["by_whole"],
            "found_only_by_parts": c["by_parts"],
        }
        for b, c in per_benchmark.items()
    }
    stats = result.stats
    report = {
        "benchmarks": benchmarks,
        "ngram": index.ngram,
        "dirty_threshold": d.dirty_threshold,
        "clean_threshold": d.clean_threshold,
        "action": d.action,
        "documents_scanned": stats["documents"],
        "characters_scanned": stats["characters"],
        "bytes_scanned": stats["bytes"],
        "records_skipped": stats["skipped"],
        "documents_flagged": len(outcome.flagged),
        "scan_seconds": stats["seconds"],
        "inputs": result.sources,
        **{k: v for k, v in extra.items() if k != "document_actions"},
    }
    atomic_write_json(out / "report.json", report)
    md = [f"# Decontamination ({index.ngram}-character n-grams)", ""]
    md += [
        "| benchmark | items | dirty | partial | clean | found as a whole | found only by parts |",
        "|---|---|---|---|---|---|---|",
    ]
    for b, c in benchmarks.items():
        md.append(
            f"| {b} | {c['items']:,} | {c['dirty']:,} | {c['partial']:,} | {c['clean']:,} | "
            f"{c['found_whole']:,} | {c['found_only_by_parts']:,} |"
        )
    md += [
        "",
        f"Statuses: dirty = coverage >= {d.dirty_threshold}, clean = coverage < "
        f"{d.clean_threshold}, partial in between. Coverage is the share of an item's "
        "characters found in the training data: of its text as one string, or of its "
        "distinguishing parts (COPA premise and right alternative, BoolQ passage and question, "
        "...), whichever is higher. A part shorter than the n-gram counts only in a document "
        "that holds every part of the item; a longer one stands alone. 'Found only by parts': "
        "items the whole-text match alone would have left at a lower status.",
        f"Scanned {stats['documents']:,} documents ({stats['bytes'] / 1e6:,.1f} MB); "
        f"{len(outcome.flagged):,} hold part of a dirty or partial item (action: {d.action}).",
    ]
    if extra.get("documents_dropped") is not None:
        md.append(
            f"Decontaminated corpus: {extra['documents_dropped']:,} documents dropped, "
            f"{extra['documents_cut']:,} cut ({extra['characters_removed']:,} characters removed)."
        )
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    flagged_lines = []
    actions = extra.get("document_actions", {})
    arrays = result.arrays()
    for doc in sorted(outcome.flagged):
        held = sorted(outcome.flagged[doc])
        flagged_lines.append(
            json.dumps(
                {
                    "document": names[doc],
                    "source": result.sources[int(arrays["doc_source"][doc])],
                    "record": int(arrays["doc_record"][doc]),
                    "items": [[index.benchmarks[i], index.item_ids[i]] for i in held],
                    "action": actions.get(doc, "flagged"),
                },
                ensure_ascii=False,
            )
        )
    atomic_write_text(out / "flagged.jsonl", "".join(line + "\n" for line in flagged_lines))
    return report


# ---------------------------------------------------------------------------------------------
# The decontaminated corpus (run mode)


def _cut(text: str, spans: list[tuple[int, int]], margin: int) -> tuple[str, int]:
    """Text without the spans (each widened by `margin` characters); removed character count."""
    widened = sorted((max(0, s - margin), min(len(text), e + margin)) for s, e in spans)
    merged: list[list[int]] = []
    for s, e in widened:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    pieces, last = [], 0
    for s, e in merged:
        pieces.append(text[last:s].strip())
        last = e
    pieces.append(text[last:].strip())
    kept = "\n\n".join(p for p in pieces if p)
    return kept, sum(e - s for s, e in merged)


def write_corpus(
    tmp: Path, corpus_dir: Path, index, result: ScanResult, outcome: Outcome, cfg: Config
) -> dict:
    """Copy the corpus into tmp/corpus without the flagged documents (or their matching spans)."""
    import zstandard

    from hanlm.data.corpus import corpus_parts

    out = tmp / "corpus"
    out.mkdir()
    a = result.arrays()
    by_part: dict[int, dict[int, int]] = {}  # part -> record -> scan document
    for doc in outcome.flagged:
        by_part.setdefault(int(a["doc_source"][doc]), {})[int(a["doc_record"][doc])] = doc
    d = cfg.decontam
    counts = Counter()
    actions: dict[int, str] = {}
    parts = []
    for part_index, part in enumerate(corpus_parts(corpus_dir)):
        target = out / part.name
        flagged = by_part.get(part_index, {}) if d.action != "keep" else {}
        docs = chars = 0
        if not flagged:
            try:
                os.link(part, target)  # unchanged: no second copy on disk
            except OSError:
                shutil.copy2(part, target)
            meta = _part_meta(corpus_dir, part.name)
            parts.append(meta)
            counts["documents_out"] += meta["documents"]
            counts["characters_out"] += meta["characters"]
            continue
        with open(target, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as w:
            with open_text_stream(part) as stream:
                for line_no, line in enumerate(stream):
                    doc = flagged.get(line_no)
                    if doc is None:
                        w.write(line)
                        text_len = len(json.loads(line)["text"])
                        docs, chars = docs + 1, chars + text_len
                        continue
                    record = json.loads(line)
                    if d.action == "cut":
                        spans = index.spans(record["text"], outcome.flagged[doc])
                        kept, removed = _cut(record["text"], spans, d.cut_margin)
                        if len(kept) >= max(1, cfg.corpus.min_chars):
                            record["text"] = kept
                            w.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
                            docs, chars = docs + 1, chars + len(kept)
                            counts["documents_cut"] += 1
                            counts["characters_removed"] += removed
                            actions[doc] = "cut"
                            continue
                    counts["documents_dropped"] += 1
                    counts["characters_removed"] += len(record["text"])
                    actions[doc] = "dropped"
            w.flush(zstandard.FLUSH_FRAME)
        record = file_record(target)
        parts.append({"path": part.name, "documents": docs, "characters": chars, **record})
        counts["documents_out"] += docs
        counts["characters_out"] += chars
    stats = {
        "source": "decontam",
        "documents_out": counts["documents_out"],
        "characters_out": counts["characters_out"],
        "parts": parts,
    }
    atomic_write_json(out / "stats.json", stats)
    return {
        "documents_dropped": counts["documents_dropped"],
        "documents_cut": counts["documents_cut"],
        "characters_removed": counts["characters_removed"],
        "documents_out": counts["documents_out"],
        "document_actions": actions,
    }


def _part_meta(corpus_dir: Path, name: str) -> dict:
    stats_path = corpus_dir / "stats.json"
    if stats_path.is_file():
        for meta in read_json(stats_path).get("parts", []):
            if meta.get("path") == name:
                return dict(meta)
    docs = chars = 0
    with open_text_stream(corpus_dir / name) as stream:
        for line in stream:
            docs += 1
            chars += len(json.loads(line)["text"])
    return {"path": name, "documents": docs, "characters": chars}


# ---------------------------------------------------------------------------------------------
# Entry points


def _workers(cfg: Config) -> int:
    return cfg.decontam.workers or os.cpu_count() or 1


def _check_thresholds(cfg: Config) -> None:
    d = cfg.decontam
    if not d.clean_threshold <= d.dirty_threshold:
        raise UserError(
            f"decontam.clean_threshold {d.clean_threshold} is above decontam.dirty_threshold "
            f"{d.dirty_threshold}",
            fix="keep clean_threshold <= dirty_threshold",
        )


def _scan_files(cfg, index, index_path, files, shard) -> ScanResult:
    with progress() as bar:
        task = bar.add_task("decontam", total=None)
        return scan(
            index,
            index_path,
            files,
            workers=_workers(cfg),
            batch_bytes=cfg.decontam.batch_bytes,
            text_field=cfg.decontam.text_field,
            shard=shard,
            on_batch=lambda job: bar.advance(task, len(job.raw)),
        )


def _finish(out: Path, index, result, cfg, fp, *, corpus_dir: Path | None, meta: dict) -> dict:
    """Write every output of a complete scan into `out` (atomically) and mark it done."""
    outcome = decide(index, result, cfg.decontam.dirty_threshold, cfg.decontam.clean_threshold)
    with atomic_output_dir(out) as tmp:
        index.save(tmp / INDEX_FILE)
        extra = dict(meta)
        if corpus_dir is not None:
            extra.update(write_corpus(tmp, corpus_dir, index, result, outcome, cfg))
        report = write_reports(tmp, index, result, outcome, cfg, extra)
        write_stage_marker(tmp, STAGE, fp)
    for bench, c in report["benchmarks"].items():
        info(f"decontam: {bench}: {c['dirty']:,} / {c['items']:,} dirty ({c['partial']:,} partial)")
    info(f"decontam: report in {out / 'report.md'}")
    return report


def _prepare_index(cfg, benchmarks, work: Path) -> tuple[BenchmarkIndex, Path]:
    items = load_items(benchmarks, cfg.decontam.text_field)
    index = BenchmarkIndex.build(items, ngram=cfg.decontam.ngram)
    work.mkdir(parents=True, exist_ok=True)
    path = work / INDEX_FILE
    index.save(path)
    return index, path


def _fp(cfg: Config, benchmarks, inputs: list) -> str:
    d = cfg.decontam.model_dump(exclude={"workers", "batch_bytes", "enabled"})
    return fingerprint(
        STAGE,
        FORMAT_VERSION,
        d,
        cfg.corpus.min_chars,
        [[t, *_file_key(p)] for t, p in benchmarks],
        inputs,
    )


def run(
    cfg: Config, run_dir: Path, *, force: bool = False, shard: tuple[int, int] | None = None
) -> dict:
    """The stage between corpus and tokenizer: scan the run's corpus, write DIR/decontam/."""
    run_dir = Path(run_dir)
    out = run_dir / STAGE
    if not cfg.decontam.enabled or not cfg.decontam.benchmarks:
        # A finished earlier output would otherwise be trained on; anything else there is not
        # hanlm's to delete (and, with no stage marker, is never read as a decontaminated corpus).
        if stage_fingerprint(out) is not None:
            shutil.rmtree(out)
        why = "disabled" if not cfg.decontam.enabled else "no decontam.benchmarks configured"
        info(f"decontam: {why}; training reads {run_dir / 'corpus'}")
        return {"enabled": False}
    _check_thresholds(cfg)
    corpus_dir = run_dir / "corpus"
    corpus_fp = stage_fingerprint(corpus_dir)
    if corpus_fp is None:
        raise UserError(
            f"no finished corpus in {corpus_dir}", fix=f"run `hanlm corpus --run {run_dir}` first"
        )
    if any(readers.parse_spec(spec)[1] == "demo" for spec in cfg.decontam.benchmarks):
        from hanlm.data.corpus import ensure_demo_world

        ensure_demo_world(cfg, run_dir)  # there already when the corpus came from the demo
    benchmarks = benchmark_specs(cfg.decontam.benchmarks, run_dir)
    fp = _fp(cfg, benchmarks, [corpus_fp])
    from hanlm.data.corpus import corpus_parts, damaged_parts

    if shard is None and not force and stage_fingerprint(out) == fp:
        problems = damaged_parts(out / "corpus") + _damaged_index(out / INDEX_FILE)
        if not problems:
            info(f"decontam: up to date in {out}, skipped")
            return read_json(out / "report.json")
        warn(f"decontam: {out / 'corpus'} is damaged ({'; '.join(problems[:3])}); scanning again")

    files = corpus_parts(corpus_dir)
    return _scan(cfg, benchmarks, files, run_dir / PARTIAL, out, fp, shard, corpus_dir, "run")


def standalone(
    cfg: Config,
    corpus: list[str],
    out_dir: Path,
    *,
    force: bool = False,
    shard: tuple[int, int] | None = None,
) -> dict:
    """Scan any training data (`--corpus` globs) against the benchmarks into OUT/decontam/."""
    _check_thresholds(cfg)
    files = expand_corpus(corpus)
    benchmarks = benchmark_specs(cfg.decontam.benchmarks, None)
    out_dir = Path(out_dir)
    out = out_dir / STAGE
    fp = _fp(cfg, benchmarks, [_file_key(f) for f in files])
    if shard is None and not force and stage_fingerprint(out) == fp:
        info(f"decontam: up to date in {out}, skipped")
        return read_json(out / "report.json")
    return _scan(cfg, benchmarks, files, out_dir / PARTIAL, out, fp, shard, None, "standalone")


def _scan(cfg, benchmarks, files, work: Path, out: Path, fp: str, shard, corpus_dir, mode: str):
    """Index, scan, then either save this shard's partial result or finish the reports."""
    index, index_path = _prepare_index(cfg, benchmarks, work)
    result = _scan_files(cfg, index, index_path, files, shard)
    if shard is not None:
        return _save_partial(work, result, shard, fp)
    report = _finish(out, index, result, cfg, fp, corpus_dir=corpus_dir, meta={"mode": mode})
    shutil.rmtree(work, ignore_errors=True)
    return report


def _save_partial(work: Path, result: ScanResult, shard: tuple[int, int], fp: str) -> dict:
    i, n = shard
    # every shard writes index.npz again: each records the copy it left, for merge to check
    index = file_record(work / INDEX_FILE)
    result.save(
        work / f"shard-{i:04d}-of-{n:04d}", {"fingerprint": fp, "shard": [i, n], "index": index}
    )
    info(
        f"decontam: shard {i}/{n} scanned {result.stats['documents']:,} documents -> {work}; "
        f"run `hanlm decontam merge` once every shard is done"
    )
    return {"shard": [i, n], **result.stats}


def merge(cfg: Config, *, out_dir: Path | None = None, run_dir: Path | None = None) -> dict:
    """Combine every shard's partial result in DIR/decontam-partial/ into DIR/decontam/.

    Each `--shard I/N` run writes shard-I-of-N.{npz,json} and index.npz there; on machines that
    do not share DIR, copy every shard's files into one DIR/decontam-partial/ first."""
    root = Path(run_dir if run_dir is not None else out_dir)
    work = root / PARTIAL
    metas = sorted(work.glob("shard-*-of-*.json"))
    if not metas:
        raise UserError(
            f"no partial results in {work}",
            fix="run `hanlm decontam ... --shard I/N` for every I first (same --out or --run)",
        )
    loaded = [
        ScanResult.load(
            m.with_suffix(""), rerun=f"run that shard again ({_shard_of(m)}), then merge"
        )
        for m in metas
    ]
    fps = {meta["fingerprint"] for _, meta in loaded}
    n = loaded[0][1]["shard"][1]
    have = sorted(meta["shard"][0] for _, meta in loaded)
    if len(fps) != 1 or any(meta["shard"][1] != n for _, meta in loaded):
        raise UserError(
            f"the partial results in {work} come from different settings or shard counts",
            fix="delete the folder and rerun every shard with the same settings",
        )
    if have != list(range(n)):
        missing = sorted(set(range(n)) - set(have))
        raise UserError(
            f"shards {', '.join(f'{i}/{n}' for i in missing)} have no result in {work}",
            fix="run those shards, then merge again",
        )
    result = loaded[0][0]
    for other, _ in loaded[1:]:
        result.merge(other)
    problems = [file_mismatch(work / INDEX_FILE, meta.get("index", {})) for _, meta in loaded]
    if all(problems):  # the index must be the copy one of the shards wrote
        raise UserError(
            f"the benchmark index in {work} is damaged: {problems[-1] or 'no checksum recorded'}",
            fix="run any one shard again (it writes the index anew), then merge",
        )
    index = BenchmarkIndex.load(work / INDEX_FILE)
    corpus_dir = Path(run_dir) / "corpus" if run_dir is not None else None
    meta = {"mode": "run" if run_dir is not None else "standalone", "shards": n}
    report = _finish(root / STAGE, index, result, cfg, fps.pop(), corpus_dir=corpus_dir, meta=meta)
    shutil.rmtree(work, ignore_errors=True)
    return report


def _shard_of(meta_path: Path) -> str:
    """`--shard I/N` for a shard-IIII-of-NNNN.json file name."""
    try:
        _, i, _, n = meta_path.stem.split("-")
        return f"--shard {int(i)}/{int(n)}"
    except ValueError:
        return meta_path.stem


def _damaged_index(path: Path) -> list[str]:
    """What is wrong with a saved index.npz (a zip: every member's CRC is checked), or []."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        return [f"{path.name} cannot be read ({e})"]
    return [f"{path.name} fails the checksum of {bad}"] if bad else []


def load_run_index(run_dir: Path) -> BenchmarkIndex | None:
    """The index the run's decontam stage saved, or None when the run has no decontam output."""
    path = Path(run_dir) / STAGE / INDEX_FILE
    if stage_fingerprint(path.parent) is None or not path.is_file():
        return None
    problems = _damaged_index(path)
    if problems:
        raise UserError(
            f"the run's decontamination index is damaged: {problems[0]}",
            where=str(path),
            fix=f"run `hanlm decontam --run {run_dir}` again (it scans anew when its output is "
            "damaged)",
        )
    return BenchmarkIndex.load(path)


def training_corpus_dir(run_dir: Path) -> Path:
    """The corpus training reads: DIR/decontam/corpus when that stage finished, else DIR/corpus."""
    from hanlm.data.corpus import training_corpus_dir as from_corpus

    return from_corpus(run_dir)
