"""What a decontamination scan leaves: per-item outcomes, the reports and the cleaned corpus.

Outputs in a decontam folder: index.npz (the benchmark index, reusable from Python), items.jsonl
(per item: benchmark, item_id, coverage, status, a few matching document ids), report.json,
report.md, flagged.jsonl (every document holding part of a dirty or partial item, and what was
done to it), and for a run's corpus corpus/: the decontaminated corpus in the corpus stage's
format (untouched parts hard-linked, not copied), which the tokenizer and shards stages then read.
A sharded scan leaves partial results in a work folder until they are merged.
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
import zstandard
from datatrove.pipeline.base import PipelineStep
from pydantic import Field

from hanlm.config import DEFAULT_SOURCE, Config
from hanlm.console import info
from hanlm.data import engine
from hanlm.data.corpus import STATS_FILE, corpus_parts, part_sources
from hanlm.data.decontam.index import BenchmarkIndex
from hanlm.data.decontam.scan import ScanResult, scan, share_index, task_index
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, atomic_write_text, file_mismatch, file_record, read_json
from hanlm.results import Part, Result, read_records
from hanlm.streams import open_text_stream

INDEX_FILE = "index.npz"
ITEMS_FILE = "items.jsonl"
REPORT_FILE = "report.json"


class BenchmarkContamination(Part):
    """One benchmark's items by status, and how the dirty and partial ones were found."""

    items: int
    dirty: int
    partial: int
    clean: int
    found_whole: int
    found_only_by_parts: int


class DecontamReport(Result):
    """`decontam/report.json`: every benchmark's items by status, the matching rule, what was
    scanned and, for a run's corpus, what the action did to it."""

    FILE = REPORT_FILE
    MADE_BY = "decontam"

    benchmarks: dict[str, BenchmarkContamination]
    # benchmark -> corpus source -> its dirty and partial items held by that source's documents
    by_source: dict[str, dict[str, int]] = Field(default_factory=dict)
    action_sources: list[str] = Field(default_factory=list)  # where it acted; empty: every source
    ngram: int
    dirty_threshold: float
    clean_threshold: float
    action: str
    documents_scanned: int
    characters_scanned: int
    bytes_scanned: int
    records_skipped: int
    documents_flagged: int
    scan_seconds: float
    inputs: list[str]
    mode: str  # run, standalone
    shards: int | None = None  # a merge of a sharded scan: how many
    # what the action did to the run's corpus (absent when no corpus was written)
    documents_dropped: int | None = None
    documents_cut: int | None = None
    characters_removed: int | None = None
    documents_out: int | None = None


class DecontamItem(Part):
    """One line of `decontam/items.jsonl`: a benchmark item, its status and who held it."""

    benchmark: str
    item_id: str | int
    coverage: float  # the share of its text found in the corpus
    status: str  # dirty, partial, clean
    found_by: str | None  # whole, parts, or None (clean)
    sources: list[str]  # the corpus sources whose documents held it
    documents: list[str]  # the first documents that held it


def read_items(path: Path) -> list[DecontamItem]:
    """The items of a decontam folder's items.jsonl ([] when the stage did not run; see
    hanlm.results.read_records)."""
    fix = "run `hanlm decontam --run RUN --force` to write it again"
    return read_records(path, DecontamItem, what="a decontam item", fix=fix)


CORPUS_DIR = "corpus"  # the cleaned corpus, when the action changes text


# ---------------------------------------------------------------------------------------------
# From scan result to per-item and per-document outcomes


@dataclass
class Outcome:
    coverage: np.ndarray  # per item
    status: list[str]
    found_by: list[str | None]  # per item: "whole", "parts" or None (clean)
    item_docs: list[list[int]]  # per item: documents (indices into the scan) holding it, best first
    flagged: dict[int, set[int]]  # document -> non-clean items it holds part of
    doc_sources: list[str]  # per scanned document: the corpus source of its part

    def item_sources(self, item: int) -> list[str]:
        """The corpus sources whose documents hold part of a dirty or partial item."""
        if self.status[item] == "clean":
            return []
        return sorted({self.doc_sources[doc] for doc in self.item_docs[item]})


def decide(index: BenchmarkIndex, result: ScanResult, dirty: float, clean: float) -> Outcome:
    coverage, whole = index.item_coverage(result.found)
    status = [index.status(item_coverage, dirty=dirty, clean=clean) for item_coverage in coverage]
    found_by = [
        index.found_by(item_status, whole_match, dirty=dirty, clean=clean)
        for item_status, whole_match in zip(status, whole, strict=True)
    ]
    arrays = result.arrays()
    share = arrays["pair_count"] / np.maximum(index.pairs_per_item[arrays["pair_item"]], 1)
    order = np.lexsort((arrays["pair_doc"], -share, arrays["pair_item"]))
    item_docs: list[list[int]] = [[] for _ in range(len(index))]
    flagged: dict[int, set[int]] = {}
    for doc, item in zip(arrays["pair_doc"][order].tolist(), arrays["pair_item"][order].tolist(),
                         strict=True):  # fmt: skip
        item_docs[item].append(doc)
        if status[item] != "clean":
            flagged.setdefault(doc, set()).add(item)
    of_file = _file_sources(result.sources)
    doc_sources = [of_file[f] for f in arrays["doc_source"].tolist()]
    return Outcome(coverage, status, found_by, item_docs, flagged, doc_sources)


def _file_sources(files: list[str]) -> list[str]:
    """The corpus source of each scanned file: a corpus part's, as its folder's stats.json
    names it; any other file (decontam --corpus) is one source, as a flat corpus is."""
    by_folder: dict[Path, dict[str, str]] = {}
    out = []
    for name in files:
        path = Path(name)
        if path.parent not in by_folder:
            by_folder[path.parent] = part_sources(path.parent) if path.parent.is_dir() else {}
        out.append(by_folder[path.parent].get(path.name, DEFAULT_SOURCE))
    return out


def _items_jsonl(index, result, outcome: Outcome, max_documents: int) -> str:
    names = result.doc_names()
    lines = []
    for i in range(len(index)):
        row = {
            "benchmark": index.benchmarks[i],
            "item_id": index.item_ids[i],
            "coverage": round(float(outcome.coverage[i]), 4),
            "status": outcome.status[i],
            "found_by": outcome.found_by[i],
            "sources": outcome.item_sources(i),
            "documents": [names[doc] for doc in outcome.item_docs[i][:max_documents]],
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    return "\n".join(lines) + "\n" if lines else ""


def _per_benchmark(index, outcome: Outcome) -> dict[str, dict]:
    per_benchmark: dict[str, Counter] = {}
    for bench, status, how in zip(index.benchmarks, outcome.status, outcome.found_by,
                                  strict=True):  # fmt: skip
        counts = per_benchmark.setdefault(bench, Counter())
        counts[status] += 1
        counts[f"by_{how}"] += how is not None
    return {
        bench: {
            "items": sum(counts[status] for status in ("dirty", "partial", "clean")),
            **{status: counts[status] for status in ("dirty", "partial", "clean")},
            "found_whole": counts["by_whole"],
            "found_only_by_parts": counts["by_parts"],
        }
        for bench, counts in per_benchmark.items()
    }


def _by_source(index, outcome: Outcome) -> dict[str, dict[str, int]]:
    """Every benchmark's dirty and partial items per corpus source scanned (0s included)."""
    sources = list(dict.fromkeys(outcome.doc_sources))
    counts = {bench: dict.fromkeys(sources, 0) for bench in dict.fromkeys(index.benchmarks)}
    for item, bench in enumerate(index.benchmarks):
        for source in outcome.item_sources(item):
            counts[bench][source] += 1
    return counts


def _source_table(by_source: dict[str, dict[str, int]]) -> list[str]:
    sources = list(dict.fromkeys(s for counts in by_source.values() for s in counts))
    if not sources:
        return []
    md = [
        "",
        "Dirty and partial items by the corpus source whose documents held them (an item "
        "found in two sources counts in both):",
        "",
        "| benchmark | " + " | ".join(sources) + " |",
        "|---|" + "---|" * len(sources),
    ]
    for bench, counts in by_source.items():
        md.append(f"| {bench} | " + " | ".join(f"{counts.get(s, 0):,}" for s in sources) + " |")
    return md


def _report_markdown(report: dict, outcome: Outcome, extra: dict) -> str:
    stats_docs, stats_bytes = report["documents_scanned"], report["bytes_scanned"]
    md = [f"# Decontamination ({report['ngram']}-character n-grams)", ""]
    md += [
        "| benchmark | items | dirty | partial | clean | found as a whole | found only by parts |",
        "|---|---|---|---|---|---|---|",
    ]
    for bench, counts in report["benchmarks"].items():
        md.append(
            f"| {bench} | {counts['items']:,} | {counts['dirty']:,} | {counts['partial']:,} | {counts['clean']:,} | "
            f"{counts['found_whole']:,} | {counts['found_only_by_parts']:,} |"
        )
    md += [
        "",
        f"Statuses: dirty = coverage >= {report['dirty_threshold']}, clean = coverage < "
        f"{report['clean_threshold']}, partial in between. Coverage is the share of an item's "
        "characters found in the training data: of its text as one string, or of its "
        "distinguishing parts (COPA premise and right alternative, BoolQ passage and question, "
        "...), whichever is higher. A part shorter than the n-gram counts only in a document "
        "that holds every part of the item; a longer one stands alone. 'Found only by parts': "
        "items the whole-text match alone would have left at a lower status.",
        f"Scanned {stats_docs:,} documents ({stats_bytes / 1e6:,.1f} MB); "
        f"{len(outcome.flagged):,} hold part of a dirty or partial item "
        f"(action: {report['action']}"
        + (f" on {', '.join(report['action_sources'])} only" if report["action_sources"] else "")
        + ").",
    ]
    if extra.get("documents_dropped") is not None:
        md.append(
            f"Decontaminated corpus: {extra['documents_dropped']:,} documents dropped, "
            f"{extra['documents_cut']:,} cut ({extra['characters_removed']:,} characters removed)."
        )
    md += _source_table(report["by_source"])
    return "\n".join(md) + "\n"


def _shown_source(source: str, run_root: Path) -> str:
    """A corpus part inside the run as a path relative to the run folder (the run may move or
    be copied); a file outside it (decontam --corpus) as it was given."""
    try:
        return str(Path(source).relative_to(run_root.resolve()))
    except ValueError:
        return source


def _flagged_jsonl(index, result, outcome: Outcome, actions: dict[int, str], run_root: Path) -> str:
    names = result.doc_names()
    arrays = result.arrays()
    lines = []
    for doc in sorted(outcome.flagged):
        held = sorted(outcome.flagged[doc])
        record = {
            "document": names[doc],
            "source": _shown_source(result.sources[int(arrays["doc_source"][doc])], run_root),
            "corpus_source": outcome.doc_sources[doc],
            "record": int(arrays["doc_record"][doc]),
            "items": [[index.benchmarks[i], index.item_ids[i]] for i in held],
            "action": actions.get(doc, "flagged"),
        }
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return "".join(lines)


def write_reports(out: Path, index, result, outcome, cfg: Config, extra: dict) -> DecontamReport:
    """items.jsonl, report.md and flagged.jsonl into `out`; the report (which the pipeline
    keeps as report.json)."""
    decontam = cfg.decontam
    atomic_write_text(
        out / ITEMS_FILE, _items_jsonl(index, result, outcome, decontam.max_documents)
    )
    stats = result.stats
    report = {
        "benchmarks": _per_benchmark(index, outcome),
        "by_source": _by_source(index, outcome),
        "action_sources": list(decontam.action_sources),
        "ngram": index.ngram,
        "dirty_threshold": decontam.dirty_threshold,
        "clean_threshold": decontam.clean_threshold,
        "action": decontam.action,
        "documents_scanned": stats["documents"],
        "characters_scanned": stats["characters"],
        "bytes_scanned": stats["bytes"],
        "records_skipped": stats["skipped"],
        "documents_flagged": len(outcome.flagged),
        "scan_seconds": stats["seconds"],
        "inputs": [_shown_source(source, out.parent) for source in result.sources],
        **{key: value for key, value in extra.items() if key != "document_actions"},
    }
    typed = DecontamReport.model_validate(report)
    atomic_write_text(out / "report.md", _report_markdown(report, outcome, extra))
    actions = extra.get("document_actions", {})
    flagged = _flagged_jsonl(index, result, outcome, actions, out.parent)
    atomic_write_text(out / "flagged.jsonl", flagged)
    return typed


# ---------------------------------------------------------------------------------------------
# The decontaminated corpus (run mode)


def _cut(text: str, spans: list[tuple[int, int]], margin: int) -> tuple[str, int]:
    """Text without the spans (each widened by `margin` characters); removed character count."""
    widened = sorted((max(0, start - margin), min(len(text), end + margin)) for start, end in spans)
    merged: list[list[int]] = []
    for start, end in widened:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    pieces, last = [], 0
    for start, end in merged:
        pieces.append(text[last:start].strip())
        last = end
    pieces.append(text[last:].strip())
    kept = "\n\n".join(piece for piece in pieces if piece)
    return kept, sum(end - start for start, end in merged)


WRITE = "write"  # the data engine job writing the decontaminated parts


@dataclass(frozen=True)
class PartEdit:
    """A corpus part holding flagged documents: its counts and (record, scan document, items)."""

    path: str
    documents: int
    characters: int
    flagged: tuple[tuple[int, int, tuple[int, ...]], ...]


def _part_stats_path(work: Path, rank: int) -> Path:
    return Path(work) / "stats" / WRITE / f"{rank:05d}.json"


class WriteCleanParts(PipelineStep):
    """One task per corpus part with flagged documents: the part without them (drop) or without
    their matching spans (cut), and its counts, into the task's own files."""

    name = "✂️ decontam write"
    type = "💽 - WRITER"

    def __init__(
        self, edits: list[PartEdit], index_path: Path, decontam, min_chars: int, work: Path
    ):
        super().__init__()
        self.edits, self.index_path, self.work = edits, str(index_path), str(work)
        self.action, self.cut_margin = decontam.action, decontam.cut_margin
        self.min_chars = min_chars

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        edit, work = self.edits[rank], Path(self.work)
        index = task_index(Path(self.index_path)) if self.action == "cut" else None
        flagged = {record: (doc, set(items)) for record, doc, items in edit.flagged}
        target = work / WRITE / f"{rank:05d}" / Path(edit.path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        counter = engine.TaskCounter(work, WRITE, rank)
        counts: Counter = Counter()
        actions: list[tuple[int, str]] = []
        lost = 0  # characters the part's documents lost (dropped whole, or cut)
        with open(target, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as writer:
            with open_text_stream(Path(edit.path)) as stream:
                for line_no, line in enumerate(stream):
                    counter.add(1, len(line))
                    if line_no not in flagged:
                        writer.write(line)
                        continue
                    doc, items = flagged[line_no]
                    record = json.loads(line)
                    text = record["text"]
                    if self.action == "cut":
                        kept, removed = _cut(text, index.spans(text, items), self.cut_margin)
                        if len(kept) >= max(1, self.min_chars):
                            record["text"] = kept
                            writer.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
                            counts["documents_cut"] += 1
                            counts["characters_removed"] += removed
                            lost += len(text) - len(kept)
                            actions.append((doc, "cut"))
                            continue
                    counts["documents_dropped"] += 1
                    counts["characters_removed"] += len(text)
                    lost += len(text)
                    actions.append((doc, "dropped"))
            writer.flush(zstandard.FLUSH_FRAME)
        counter.flush()
        documents = edit.documents - counts["documents_dropped"]
        stats = {
            **counts,
            "part": {"path": target.name, "documents": documents,
                     "characters": edit.characters - lost, **file_record(target)},
            "actions": actions,
        }  # fmt: skip
        path = _part_stats_path(work, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, stats)


def write_corpus(
    tmp: Path, corpus_dir: Path, index_path: Path, result: ScanResult, outcome: Outcome,
    cfg: Config, work: Path,
) -> dict | None:  # fmt: skip
    """Copy the corpus into tmp/corpus without the flagged documents (or their matching spans):
    parts without any hard-linked, the others rewritten by tasks of the data engine (one per
    part). None when those were submitted to a cluster."""
    arrays = result.arrays()
    by_part: dict[int, dict[int, int]] = {}  # part -> record -> scan document
    for doc in outcome.flagged:
        by_part.setdefault(int(arrays["doc_source"][doc]), {})[int(arrays["doc_record"][doc])] = doc
    decontam = cfg.decontam
    parts = corpus_parts(corpus_dir)
    metas = _part_metas(corpus_dir, parts)
    edits: dict[int, int] = {}  # part -> task
    plan: list[PartEdit] = []
    acted_on = set(decontam.action_sources)
    for part_index, part in enumerate(parts):
        flagged = by_part.get(part_index, {}) if decontam.action != "keep" else {}
        if acted_on and metas[part.name].get("source", DEFAULT_SOURCE) not in acted_on:
            flagged = {}  # another source's leaks: reported, left in
        if flagged:
            held = tuple(
                (record, doc, tuple(sorted(outcome.flagged[doc])))
                for record, doc in sorted(flagged.items())
            )
            edits[part_index] = len(plan)
            meta = metas[part.name]
            plan.append(PartEdit(str(part), meta["documents"], meta["characters"], held))
    if plan:
        step = WriteCleanParts(plan, index_path, decontam, cfg.corpus.min_chars, work)
        job = engine.Job(WRITE, [step], tasks=len(plan))
        total = sum(part.stat().st_size for i, part in enumerate(parts) if i in edits) or None
        progress = engine.Progress(work, "decontam", {WRITE: total} if total else None)
        if not engine.run_jobs([job], cfg.data_engine, work, progress=progress):
            return None
    out = tmp / CORPUS_DIR
    out.mkdir()
    counts = Counter()
    actions: dict[int, str] = {}
    written = []
    for part_index, part in enumerate(parts):
        target = out / part.name
        if part_index not in edits:
            _link(part, target)  # unchanged: no second copy on disk
            meta = dict(metas[part.name])
        else:
            rank = edits[part_index]
            stats = read_json(_part_stats_path(work, rank))
            # linked, not moved: the task stays complete, should this run stop before the end
            _link(work / WRITE / f"{rank:05d}" / part.name, target)
            meta = {**stats["part"], "source": metas[part.name].get("source", DEFAULT_SOURCE)}
            for key in ("documents_dropped", "documents_cut", "characters_removed"):
                counts[key] += stats.get(key, 0)
            actions.update((doc, action) for doc, action in stats["actions"])
        written.append(meta)
        counts["documents_out"] += meta["documents"]
        counts["characters_out"] += meta["characters"]
    stats = {
        "source": "decontam",
        "documents_out": counts["documents_out"],
        "characters_out": counts["characters_out"],
        "parts": written,
    }
    atomic_write_json(out / STATS_FILE, stats)
    return {
        "documents_dropped": counts["documents_dropped"],
        "documents_cut": counts["documents_cut"],
        "characters_removed": counts["characters_removed"],
        "documents_out": counts["documents_out"],
        "document_actions": actions,
    }


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _part_metas(corpus_dir: Path, parts: list[Path]) -> dict[str, dict]:
    """name -> {path, documents, characters, ...} of every part: from the corpus's stats.json,
    counted for a part it does not list."""
    listed: dict[str, dict] = {}
    stats_path = corpus_dir / STATS_FILE
    if stats_path.is_file():
        listed = {part.get("path"): dict(part) for part in read_json(stats_path).get("parts", [])}
    metas = {}
    for part in parts:
        if part.name in listed:
            metas[part.name] = listed[part.name]
            continue
        docs = chars = 0
        with open_text_stream(part) as stream:
            for line in stream:
                docs += 1
                chars += len(json.loads(line)["text"])
        metas[part.name] = {"path": part.name, "documents": docs, "characters": chars}
    return metas


# ---------------------------------------------------------------------------------------------
# Scanning, finishing, and the partial results of a sharded scan


def scan_files(cfg: Config, index, index_path: Path, files, shard, work: Path):
    """Scan the files (this shard's share of them) on the data engine in `work`; None when the
    job was submitted to a cluster."""
    return scan(
        index,
        index_path,
        files,
        engine_cfg=cfg.data_engine,
        work=work,
        text_field=cfg.decontam.text_field,
        batch_bytes=cfg.decontam.batch_bytes,
        shard=shard,
    )


def finish(
    out: Path, index, result, cfg, *, corpus_dir: Path | None, meta: dict, work: Path,
    index_path: Path,
) -> DecontamReport | None:  # fmt: skip
    """Write every output of a complete scan into the (empty, temporary) folder `out`; the
    cleaned corpus is written by data engine tasks in `work` (None: submitted to a cluster)."""
    outcome = decide(index, result, cfg.decontam.dirty_threshold, cfg.decontam.clean_threshold)
    index.save(out / INDEX_FILE)
    extra = dict(meta)
    if corpus_dir is not None:
        share_index(index_path, index)
        written = write_corpus(out, corpus_dir, index_path, result, outcome, cfg, work)
        if written is None:
            return None
        extra.update(written)
    report = write_reports(out, index, result, outcome, cfg, extra)
    for bench, counts in report.benchmarks.items():
        info(
            f"decontam: {bench}: {counts.dirty:,} / {counts.items:,} dirty ({counts.partial:,} partial)"
        )
    return report


def save_partial(work: Path, result: ScanResult, shard: tuple[int, int], fp: str) -> dict:
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


def load_partials(work: Path) -> tuple[BenchmarkIndex, ScanResult, str, int]:
    """Every shard's partial result in `work`, checked and combined: the index, the merged
    scan result, the scan's fingerprint and the shard count."""
    metas = sorted(work.glob("shard-*-of-*.json"))
    if not metas:
        raise UserError(
            f"no partial results in {work}",
            fix="run `hanlm decontam ... --shard I/N` for every I first (same --out or --run)",
        )
    loaded = [
        ScanResult.load(
            meta_path.with_suffix(""),
            rerun=f"run that shard again ({_shard_of(meta_path)}), then merge",
        )
        for meta_path in metas
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
    result.sort_documents()
    problems = [file_mismatch(work / INDEX_FILE, meta.get("index", {})) for _, meta in loaded]
    if all(problems):  # the index must be the copy one of the shards wrote
        raise UserError(
            f"the benchmark index in {work} is damaged: {problems[-1] or 'no checksum recorded'}",
            fix="run any one shard again (it writes the index anew), then merge",
        )
    return BenchmarkIndex.load(work / INDEX_FILE), result, fps.pop(), n


def _shard_of(meta_path: Path) -> str:
    """`--shard I/N` for a shard-IIII-of-NNNN.json file name."""
    try:
        _, i, _, n = meta_path.stem.split("-")
        return f"--shard {int(i)}/{int(n)}"
    except ValueError:
        return meta_path.stem


def damaged_index(path: Path) -> list[str]:
    """What is wrong with a saved index.npz (a zip: every member's CRC is checked), or []."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        return [f"{path.name} cannot be read ({e})"]
    return [f"{path.name} fails the checksum of {bad}"] if bad else []
