"""Streaming the training data through the index on the data engine, and what a scan found.

The scan is one job of the data engine (hanlm.data.engine): its tasks come from the input, never
from the number of workers. Each file is a piece, except an uncompressed .jsonl file bigger than
a task (`data_engine.task_mb`), which is cut into byte ranges; consecutive small files are
grouped into tasks of about that size. A task loads the saved benchmark index once (a worker
forked from the stage's process shares the stage's copy), reads its pieces in batches of about
`decontam.batch_bytes`, parses, normalises, hashes and looks up, and writes only the hits and its
counts to its own files in the work folder. The stage's process then merges them in task order,
so the result does not depend on how many workers ran, and a killed scan run again redoes only
the tasks that had not finished.

Inputs: plain text (.txt, one document per blank-line-separated block), JSONL with a text field,
chat JSONL (`messages: [{role, content}]`, every message's content counts), each optionally .gz
or .zst; a run's corpus parts are JSONL.
"""

from __future__ import annotations

import glob
import hashlib
import io
import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datatrove.pipeline.base import PipelineStep

from hanlm.config import DataEngineSection
from hanlm.data import engine
from hanlm.data.decontam.folding import prepare_tables
from hanlm.data.decontam.hashing import distinct
from hanlm.data.decontam.index import BenchmarkIndex, batches
from hanlm.errors import UserError
from hanlm.files import atomic_write_bytes, file_mismatch, read_json
from hanlm.streams import lines_in_range, open_text_stream
from hanlm.streams import strip_compression_suffix as _plain_name

SUPPORTED = ".txt, .jsonl (a text field, or chat `messages`), each optionally .gz or .zst"
SCAN = "scan"  # the job's name: its folder in the work folder
MB = 1 << 20  # bytes per data_engine.task_mb


def expand_corpus(patterns: list[str]) -> list[Path]:
    """Globs -> sorted files; no match, or an unsupported type, is a UserError."""
    if not patterns:
        raise UserError("no training data given", fix="pass --corpus GLOB (repeatable)")
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(pattern), recursive=True))
        matches = [m for m in matches if m.is_file()]
        if not matches:
            raise UserError(
                f"--corpus {pattern!r} matches no file",
                fix="check the path or glob pattern (quote it so the shell does not expand it)",
            )
        for path in matches:
            if Path(_plain_name(path.name)).suffix.lower() not in (".txt", ".jsonl"):
                raise UserError(
                    f"unsupported training data file {path.name!r}",
                    where=str(path),
                    fix=f"supported: {SUPPORTED}",
                )
        files.extend(m for m in matches if m not in files)
    return files


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """`I/N` (0 <= I < N) -> (I, N)."""
    if spec is None:
        return None
    try:
        shard_index, shard_count = (int(x) for x in spec.split("/"))
        if not 0 <= shard_index < shard_count:
            raise ValueError
    except ValueError:
        raise UserError(
            f"bad --shard {spec!r}", fix="write it as I/N with 0 <= I < N, e.g. --shard 0/4"
        ) from None
    return shard_index, shard_count


# ---------------------------------------------------------------------------------------------
# The tasks: pieces of the input (whole files or byte ranges), grouped


@dataclass(frozen=True)
class Piece:
    """A whole file, or the lines starting in a byte range of an uncompressed .jsonl file."""

    source: int  # index into the list of files
    number: int  # place among all pieces of the input (deals records between shards)
    span: tuple[int, int] | None = None
    nbytes: int = 0


@dataclass(frozen=True)
class ScanTask:
    pieces: tuple[Piece, ...]
    deal: tuple[int, int] | None = None  # (I, N): only the records this shard is dealt


def _kind(path: Path) -> str:
    return "jsonl" if Path(_plain_name(path.name)).suffix.lower() == ".jsonl" else "txt"


def _splittable(path: Path) -> bool:
    """Uncompressed JSONL: a record is a line, so a byte range can start anywhere."""
    return _plain_name(path.name) == path.name and _kind(path) == "jsonl"


def plan_tasks(
    files: list[Path], task_bytes: int, shard: tuple[int, int] | None = None
) -> list[ScanTask]:
    """The scan's tasks: from the files and the task size only. With a shard, whole files are
    split between shards when there are at least as many files as shards, else every piece's
    records are dealt out in turn (each shard then reads every file)."""
    pieces: list[Piece] = []
    for source, path in enumerate(files):
        size = path.stat().st_size
        if size <= task_bytes or not _splittable(path):
            pieces.append(Piece(source, len(pieces), None, size))
            continue
        count = -(-size // task_bytes)
        bounds = [size * i // count for i in range(count + 1)]
        for start, end in itertools.pairwise(bounds):
            pieces.append(Piece(source, len(pieces), (start, end), end - start))
    deal = None
    if shard is not None and len(files) >= shard[1]:
        pieces = [p for p in pieces if p.source % shard[1] == shard[0]]
    elif shard is not None:
        deal = shard
    tasks: list[ScanTask] = []
    group: list[Piece] = []
    size = 0
    for piece in pieces:
        if piece.span is not None:  # a range is a task's worth on its own
            if group:
                tasks.append(ScanTask(tuple(group), deal))
                group, size = [], 0
            tasks.append(ScanTask((piece,), deal))
            continue
        group.append(piece)
        size += piece.nbytes
        if size >= task_bytes:
            tasks.append(ScanTask(tuple(group), deal))
            group, size = [], 0
    if group:
        tasks.append(ScanTask(tuple(group), deal))
    return tasks


# ---------------------------------------------------------------------------------------------
# Inside a task: raw records in batches


@dataclass(frozen=True)
class Batch:
    """Raw records read together; `records`: each one's 0-based line (a block's first) in its
    file, or in its byte range (the stage's process numbers those in the file)."""

    source: int  # index into the list of files
    kind: str  # "txt" or "jsonl"
    records: list[int]
    raw: list[bytes]


class _Lines:
    """A file's lines (or those starting in a byte range of an uncompressed one); `count`: how
    many were read, blank ones included."""

    def __init__(self, path: Path, span: tuple[int, int] | None):
        self.path, self.span, self.count = path, span, 0

    def __iter__(self) -> Iterator[bytes]:
        if self.span is None:
            with open_text_stream(self.path) as stream:
                for line in stream:
                    self.count += 1
                    yield line
            return
        for _, line in lines_in_range(self.path, *self.span):
            self.count += 1
            yield line


def _raw_records(lines: _Lines, kind: str) -> Iterator[tuple[int, bytes]]:
    if kind == "jsonl":
        for line_no, line in enumerate(lines):
            if line.strip():
                yield line_no, line
        return
    block: list[bytes] = []
    start = 0
    for line_no, line in enumerate(lines):
        if line.strip():
            if not block:
                start = line_no
            block.append(line)
        elif block:
            yield start, b"".join(block)
            block = []
    if block:
        yield start, b"".join(block)


def piece_batches(
    lines: _Lines, piece: Piece, batch_bytes: int, deal: tuple[int, int] | None
) -> Iterator[Batch]:
    """Batches of raw records of a piece (only those dealt to shard I of N with `deal`)."""
    kind = _kind(lines.path)
    records, raw, size = [], [], 0
    for ordinal, (record, data) in enumerate(_raw_records(lines, kind)):
        if deal is not None and (ordinal + piece.number) % deal[1] != deal[0]:
            continue
        records.append(record)
        raw.append(data)
        size += len(data)
        if size >= batch_bytes:
            yield Batch(piece.source, kind, records, raw)
            records, raw, size = [], [], 0
    if records:
        yield Batch(piece.source, kind, records, raw)


# The index a task scans with, loaded once per process; the stage's process puts the one it
# built here first, so workers forked from it share that copy instead of loading it.
_INDEXES: dict[tuple, BenchmarkIndex] = {}


def _index_key(path: Path) -> tuple:
    st = Path(path).stat()
    return str(Path(path).resolve()), st.st_size, st.st_mtime_ns


def share_index(path: Path, index: BenchmarkIndex) -> None:
    _INDEXES.clear()
    _INDEXES[_index_key(path)] = index
    prepare_tables()  # built once, before the workers fork


def task_index(path: Path) -> BenchmarkIndex:
    key = _index_key(path)
    if key not in _INDEXES:
        _INDEXES.clear()
        _INDEXES[key] = BenchmarkIndex.load(Path(path))
    return _INDEXES[key]


def _record_text(raw: bytes, kind: str, text_field: str) -> tuple[str | None, str | None]:
    """(document id if the record names one, text) of one record; text None when unusable."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, None
    if kind == "txt":
        return None, line
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None, None
    if not isinstance(record, dict):
        return None, None
    doc_id = record.get("id")
    doc_id = None if doc_id is None else str(doc_id)
    text = record.get(text_field)
    if isinstance(text, str):
        return doc_id, text
    messages = record.get("messages")
    if isinstance(messages, list):  # chat: every message's content counts
        parts = [m.get("content") for m in messages if isinstance(m, dict)]
        return doc_id, "\n".join(p for p in parts if isinstance(p, str))
    return doc_id, None


def scan_batch(batch: Batch, index: BenchmarkIndex, text_field: str = "text") -> dict:
    """Hits of one batch: {source, records, ids, doc, item, count, pairs, documents, chars,
    bytes, skipped}; `pairs` are the index's (entry, unit) pairs found where they count."""
    ids, texts, records = [], [], []
    skipped = 0
    for record, raw in zip(batch.records, batch.raw, strict=True):
        doc_id, text = _record_text(raw, batch.kind, text_field)
        if text is None:
            skipped += 1
            continue
        ids.append(doc_id)
        texts.append(text)
        records.append(record)
    parts, pairs = [], []
    for offset, chunk in batches(texts):
        hits, _ = index.scan_texts(chunk)
        held = index.resolve(hits)
        parts.append((held.documents + offset, held.items, held.counts))
        pairs.append(held.pairs)
    docs, items, counts = (
        np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64) for k in range(3)
    )
    hit_docs = distinct(docs)
    return {
        "source": batch.source,
        "records": np.asarray(records, dtype=np.int64)[hit_docs],
        "ids": [ids[d] for d in hit_docs.tolist()],
        "doc": np.searchsorted(hit_docs, docs),  # index into records/ids above
        "item": items,
        "count": counts,
        "pairs": distinct(np.concatenate(pairs)) if pairs else np.zeros(0, np.int64),
        "documents": len(texts),
        "chars": sum(map(len, texts)),
        "bytes": sum(map(len, batch.raw)),
        "skipped": skipped,
    }


def _task_result_path(work: Path, rank: int) -> Path:
    return Path(work) / SCAN / f"{rank:05d}"


class ScanPieces(PipelineStep):
    """One task: its pieces through the index, the hits and counts into its own files."""

    name = "🔎 decontam scan"
    type = "🔻 - FILTER"

    def __init__(self, tasks: list[ScanTask], files: list[Path], index_path: Path,
                 text_field: str, batch_bytes: int, work: Path):  # fmt: skip
        super().__init__()
        self.tasks, self.files = tasks, [str(f) for f in files]
        self.index_path, self.work = str(index_path), str(work)
        self.text_field, self.batch_bytes = text_field, batch_bytes

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        task = self.tasks[rank]
        index = task_index(Path(self.index_path))
        result = ScanResult(len(index.pair_entry))
        counter = engine.TaskCounter(self.work, SCAN, rank)
        lines = []
        for piece in task.pieces:
            reader = _Lines(Path(self.files[piece.source]), piece.span)
            for batch in piece_batches(reader, piece, self.batch_bytes, task.deal):
                part = scan_batch(batch, index, self.text_field)
                result.add(part)
                counter.add(part["documents"], part["bytes"])
                self.stat_update("documents", value=part["documents"])
            lines.append(reader.count)
        counter.flush()
        meta = {"task": rank, "lines": lines}
        result.save(_task_result_path(Path(self.work), rank), meta, sync=False)


def _replace_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# What a scan found (one shard, or all of them merged)


@dataclass
class ScanResult:
    """The index's (entry, unit) pairs found where they count, and for every document with
    hits: its source, record, id and the number of such pairs of each item it holds."""

    n_pairs: int
    found: np.ndarray = None  # bool per (entry, unit) pair
    sources: list[str] = field(default_factory=list)
    doc_source: list[np.ndarray] = field(default_factory=list)
    doc_record: list[np.ndarray] = field(default_factory=list)
    doc_ids: list[str | None] = field(default_factory=list)
    pair_doc: list[np.ndarray] = field(default_factory=list)
    pair_item: list[np.ndarray] = field(default_factory=list)
    pair_count: list[np.ndarray] = field(default_factory=list)
    stats: dict = field(default_factory=lambda: {"documents": 0, "characters": 0, "bytes": 0,
                                                 "skipped": 0, "seconds": 0.0})  # fmt: skip

    def __post_init__(self):
        if self.found is None:
            self.found = np.zeros(self.n_pairs, dtype=bool)

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)

    def add(self, part: dict) -> None:
        self.found[part["pairs"]] = True
        offset = self.n_docs
        self.doc_source.append(np.full(len(part["records"]), part["source"], dtype=np.int64))
        self.doc_record.append(np.asarray(part["records"], dtype=np.int64))
        self.doc_ids.extend(part["ids"])
        self.pair_doc.append(np.asarray(part["doc"], dtype=np.int64) + offset)
        self.pair_item.append(np.asarray(part["item"], dtype=np.int64))
        self.pair_count.append(np.asarray(part["count"], dtype=np.int64))
        for key in ("documents", "bytes", "skipped"):
            self.stats[key] += part[key]
        self.stats["characters"] += part["chars"]

    def arrays(self) -> dict[str, np.ndarray]:
        def cat(chunks):
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)

        return {
            "found": self.found,
            "doc_source": cat(self.doc_source),
            "doc_record": cat(self.doc_record),
            "pair_doc": cat(self.pair_doc),
            "pair_item": cat(self.pair_item),
            "pair_count": cat(self.pair_count),
        }

    def doc_names(self) -> list[str]:
        """An id per document with hits: its own, else FILE:RECORD (1-based line)."""
        arrays = self.arrays()
        return [
            doc_id if doc_id is not None else f"{Path(self.sources[source]).name}:{record + 1}"
            for doc_id, source, record in zip(
                self.doc_ids,
                arrays["doc_source"].tolist(),
                arrays["doc_record"].tolist(),
                strict=True,
            )
        ]

    def save(self, path: Path, meta: dict, *, sync: bool = True) -> None:
        """The arrays (.npz), then the rest with their size and checksum (.json), each written
        to a temporary name and renamed; `sync`: flushed to disk too (a task's files in the work
        folder are not: the checksum finds a file a crash left damaged)."""
        buffer = io.BytesIO()
        np.savez(buffer, **self.arrays())
        data = buffer.getvalue()
        write = atomic_write_bytes if sync else _replace_bytes
        write(path.with_suffix(".npz"), data)
        # written last, with the arrays' size and checksum: merge checks them before use
        arrays = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        rest = {**meta, "arrays": arrays, "sources": self.sources, "doc_ids": self.doc_ids,
                "stats": self.stats}  # fmt: skip
        text = json.dumps(rest, ensure_ascii=False, indent=2 if sync else None) + "\n"
        write(path.with_suffix(".json"), text.encode("utf-8"))

    @classmethod
    def load(
        cls, path: Path, *, rerun: str = "rerun that shard", required=("fingerprint", "shard")
    ) -> tuple[ScanResult, dict]:
        """A saved result and its other keys (`required` among them); a UserError (with `rerun`
        as the fix) when its files are damaged: the arrays must match the size and checksum
        recorded with them."""
        npz, json_path = path.with_suffix(".npz"), path.with_suffix(".json")
        try:
            meta = read_json(json_path)
            problem = file_mismatch(npz, meta["arrays"]) if "arrays" in meta else "no checksum"
        except (OSError, ValueError, TypeError) as e:
            problem = f"{json_path.name} cannot be read ({e})"
        if problem:
            raise UserError(f"the partial result {path.name} is damaged: {problem}", fix=rerun)
        try:
            with np.load(npz, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in archive.files}
            result = cls(len(arrays["found"]), arrays["found"], meta.pop("sources"))
            result.doc_source, result.doc_record = [arrays["doc_source"]], [arrays["doc_record"]]
            result.doc_ids = meta.pop("doc_ids")
            result.pair_doc, result.pair_item = [arrays["pair_doc"]], [arrays["pair_item"]]
            result.pair_count = [arrays["pair_count"]]
            result.stats = meta.pop("stats")
            if not set(required) <= meta.keys():  # the caller reads them
                raise KeyError(" and ".join(required))
        except (KeyError, TypeError) as e:  # the arrays match their checksum: the JSON was edited
            raise UserError(
                f"the partial result {path.name} lacks {e}", where=str(json_path), fix=rerun
            ) from None
        return result, meta

    def merge(self, other: ScanResult) -> None:
        """Add another shard's result (same index, same sources)."""
        if other.sources != self.sources or len(other.found) != len(self.found):
            raise UserError(
                "the partial results were made from different inputs or benchmarks",
                fix="rerun every shard with the same --corpus, --benchmark and settings",
            )
        self.found |= other.found
        arrays = other.arrays()
        offset = self.n_docs
        self.doc_source.append(arrays["doc_source"])
        self.doc_record.append(arrays["doc_record"])
        self.doc_ids.extend(other.doc_ids)
        self.pair_doc.append(arrays["pair_doc"] + offset)
        self.pair_item.append(arrays["pair_item"])
        self.pair_count.append(arrays["pair_count"])
        for key in ("documents", "characters", "bytes", "skipped"):
            self.stats[key] += other.stats[key]
        self.stats["seconds"] = max(self.stats["seconds"], other.stats["seconds"])

    def sort_documents(self) -> None:
        """Documents in input order (source, then record), as a scan in one piece has them:
        shards merged in any order give the single scan's result."""
        arrays = self.arrays()
        order = np.lexsort((arrays["doc_record"], arrays["doc_source"]))
        new_of = np.empty_like(order)
        new_of[order] = np.arange(len(order))
        self.doc_source, self.doc_record = (
            [arrays["doc_source"][order]],
            [arrays["doc_record"][order]],
        )
        self.doc_ids = [self.doc_ids[d] for d in order.tolist()]
        self.pair_doc = [new_of[arrays["pair_doc"]]]
        self.pair_item, self.pair_count = [arrays["pair_item"]], [arrays["pair_count"]]


def scan(
    index: BenchmarkIndex,
    index_path: Path,
    files: list[Path],
    *,
    engine_cfg: DataEngineSection,
    work: Path,
    text_field: str,
    batch_bytes: int,
    shard: tuple[int, int] | None = None,
) -> ScanResult | None:
    """Scan `files` (or a shard of them) as one job of the data engine, with `work` as its work
    folder (see engine.prepare_work_dir); None when the job was submitted to a cluster."""
    started = time.perf_counter()
    tasks = plan_tasks(files, engine_cfg.task_mb * MB, shard)
    share_index(index_path, index)
    step = ScanPieces(tasks, files, index_path, text_field, batch_bytes, work)
    job = engine.Job(SCAN, [step], tasks=len(tasks))
    total = sum(p.nbytes for t in tasks for p in t.pieces) or None
    progress = engine.Progress(work, "decontam", {SCAN: total} if total else None)
    if not engine.run_jobs([job], engine_cfg, work, progress=progress):
        return None
    result = gather(work, tasks, len(index.pair_entry), [str(f) for f in files])
    result.stats["seconds"] = round(time.perf_counter() - started, 3)
    return result


def gather(work: Path, tasks: list[ScanTask], n_pairs: int, sources: list[str]) -> ScanResult:
    """Every task's result merged in task order, records of byte ranges numbered in their file."""
    result = ScanResult(n_pairs, sources=sources)
    lines_before: dict[int, int] = {}  # source -> lines of its ranges merged so far
    for rank, task in enumerate(tasks):
        part, meta = ScanResult.load(
            _task_result_path(work, rank), rerun="run the stage again", required=("task", "lines")
        )
        part.sources = sources
        for piece, lines in zip(task.pieces, meta["lines"], strict=True):
            if piece.span is not None:  # a range: the task numbered its lines from its start
                before = lines_before.get(piece.source, 0)
                part.doc_record = [r + before for r in part.doc_record]
                lines_before[piece.source] = before + lines
        result.merge(part)
    return result
