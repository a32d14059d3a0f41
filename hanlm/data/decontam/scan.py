"""Streaming the training data through the index in several processes, and what a scan found.

Sources are read as raw lines in the main process and handed out in batches of about
`batch_bytes`; workers parse, normalise, hash and look up, and send back only the hits, so
memory stays bounded by the index and a few batches in flight, never by the corpus.

Inputs: plain text (.txt, one document per blank-line-separated block), JSONL with a text field,
chat JSONL (`messages: [{role, content}]`, every message's content counts), each optionally .gz
or .zst; a run's corpus parts are JSONL.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hanlm.data.decontam.index import BenchmarkIndex, batches
from hanlm.errors import UserError
from hanlm.files import (
    atomic_write_bytes,
    atomic_write_json,
    file_mismatch,
    open_text_stream,
    read_json,
)
from hanlm.files import strip_compression_suffix as _plain_name

SUPPORTED = ".txt, .jsonl (a text field, or chat `messages`), each optionally .gz or .zst"


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
        i, n = (int(x) for x in spec.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise UserError(
            f"bad --shard {spec!r}", fix="write it as I/N with 0 <= I < N, e.g. --shard 0/4"
        ) from None
    return i, n


# ---------------------------------------------------------------------------------------------
# Main process: raw records in batches


@dataclass(frozen=True)
class Job:
    source: int  # index into the list of files
    kind: str  # "txt" or "jsonl"
    records: list[int]  # record number in the file (0-based line, or first line of a block)
    raw: list[bytes]


def _raw_records(path: Path, kind: str) -> Iterator[tuple[int, bytes]]:
    with open_text_stream(path) as stream:
        if kind == "jsonl":
            for line_no, line in enumerate(stream):
                if line.strip():
                    yield line_no, line
            return
        block: list[bytes] = []
        start = 0
        for line_no, line in enumerate(stream):
            if line.strip():
                if not block:
                    start = line_no
                block.append(line)
            elif block:
                yield start, b"".join(block)
                block = []
        if block:
            yield start, b"".join(block)


def iter_jobs(
    files: list[Path], batch_bytes: int, shard: tuple[int, int] | None = None
) -> Iterator[Job]:
    """Batches of raw records. With a shard, whole files are split between shards when there are
    at least as many files as shards, else every file's records are dealt out in turn."""
    by_file = shard is not None and len(files) >= shard[1]
    ordinal = 0
    for source, path in enumerate(files):
        if by_file and source % shard[1] != shard[0]:
            continue
        kind = "jsonl" if Path(_plain_name(path.name)).suffix.lower() == ".jsonl" else "txt"
        records, raw, size = [], [], 0
        for record, data in _raw_records(path, kind):
            mine = shard is None or by_file or ordinal % shard[1] == shard[0]
            ordinal += 1
            if not mine:
                continue
            records.append(record)
            raw.append(data)
            size += len(data)
            if size >= batch_bytes:
                yield Job(source, kind, records, raw)
                records, raw, size = [], [], 0
        if records:
            yield Job(source, kind, records, raw)


# ---------------------------------------------------------------------------------------------
# Worker side


_index: BenchmarkIndex | None = None
_text_field = "text"


def _init_worker(index_path: str, text_field: str) -> None:
    global _index, _text_field
    _index = BenchmarkIndex.load(Path(index_path))
    _text_field = text_field


def _record_text(raw: bytes, kind: str) -> tuple[str | None, str | None]:
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
    text = record.get(_text_field)
    if isinstance(text, str):
        return doc_id, text
    messages = record.get("messages")
    if isinstance(messages, list):  # chat: every message's content counts
        parts = [m.get("content") for m in messages if isinstance(m, dict)]
        return doc_id, "\n".join(p for p in parts if isinstance(p, str))
    return doc_id, None


def scan_job(job: Job, index: BenchmarkIndex | None = None, text_field: str | None = None) -> dict:
    """Hits of one batch: {source, records, ids, doc, item, count, pairs, documents, chars,
    bytes, skipped}; `pairs` are the index's (entry, unit) pairs found where they count."""
    global _text_field
    index = index or _index
    if text_field is not None:
        _text_field = text_field
    ids, texts, records = [], [], []
    skipped = 0
    for record, raw in zip(job.records, job.raw, strict=True):
        doc_id, text = _record_text(raw, job.kind)
        if text is None:
            skipped += 1
            continue
        ids.append(doc_id)
        texts.append(text)
        records.append(record)
    parts, pairs = [], []
    for offset, batch in batches(texts):
        hits, _ = index.scan_texts(batch)
        held = index.resolve(hits)
        parts.append((held.documents + offset, held.items, held.counts))
        pairs.append(held.pairs)
    docs, items, counts = (
        np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64) for k in range(3)
    )
    hit_docs = np.unique(docs)
    return {
        "source": job.source,
        "records": np.asarray(records, dtype=np.int64)[hit_docs],
        "ids": [ids[d] for d in hit_docs.tolist()],
        "doc": np.searchsorted(hit_docs, docs),  # index into records/ids above
        "item": items,
        "count": counts,
        "pairs": np.unique(np.concatenate(pairs)) if pairs else np.zeros(0, np.int64),
        "documents": len(texts),
        "chars": sum(map(len, texts)),
        "bytes": sum(map(len, job.raw)),
        "skipped": skipped,
    }


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
        a = self.arrays()
        return [
            doc_id if doc_id is not None else f"{Path(self.sources[s]).name}:{r + 1}"
            for doc_id, s, r in zip(
                self.doc_ids, a["doc_source"].tolist(), a["doc_record"].tolist(), strict=True
            )
        ]

    def save(self, path: Path, meta: dict) -> None:
        a = self.arrays()
        buffer = io.BytesIO()
        np.savez(buffer, **a)
        data = buffer.getvalue()
        atomic_write_bytes(path.with_suffix(".npz"), data)
        # written last, with the arrays' size and checksum: merge checks them before use
        arrays = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        atomic_write_json(
            path.with_suffix(".json"),
            {**meta, "arrays": arrays, "sources": self.sources, "doc_ids": self.doc_ids,
             "stats": self.stats},
        )  # fmt: skip

    @classmethod
    def load(cls, path: Path, *, rerun: str = "rerun that shard") -> tuple[ScanResult, dict]:
        """A saved result; a UserError (with `rerun` as the fix) when its files are damaged:
        the arrays must match the size and checksum recorded with them."""
        npz, json_path = path.with_suffix(".npz"), path.with_suffix(".json")
        try:
            meta = read_json(json_path)
            problem = file_mismatch(npz, meta["arrays"]) if "arrays" in meta else "no checksum"
        except (OSError, ValueError, TypeError) as e:
            problem = f"{json_path.name} cannot be read ({e})"
        if problem:
            raise UserError(f"the partial result {path.name} is damaged: {problem}", fix=rerun)
        try:
            with np.load(npz, allow_pickle=False) as z:
                a = {k: z[k] for k in z.files}
            result = cls(len(a["found"]), a["found"], meta.pop("sources"))
            result.doc_source, result.doc_record = [a["doc_source"]], [a["doc_record"]]
            result.doc_ids = meta.pop("doc_ids")
            result.pair_doc, result.pair_item = [a["pair_doc"]], [a["pair_item"]]
            result.pair_count = [a["pair_count"]]
            result.stats = meta.pop("stats")
            if not {"fingerprint", "shard"} <= meta.keys():  # merge reads them
                raise KeyError("fingerprint and shard")
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
        a = other.arrays()
        offset = self.n_docs
        self.doc_source.append(a["doc_source"])
        self.doc_record.append(a["doc_record"])
        self.doc_ids.extend(other.doc_ids)
        self.pair_doc.append(a["pair_doc"] + offset)
        self.pair_item.append(a["pair_item"])
        self.pair_count.append(a["pair_count"])
        for key in ("documents", "characters", "bytes", "skipped"):
            self.stats[key] += other.stats[key]
        self.stats["seconds"] = max(self.stats["seconds"], other.stats["seconds"])


def scan(
    index: BenchmarkIndex,
    index_path: Path,
    files: list[Path],
    *,
    workers: int,
    batch_bytes: int,
    text_field: str,
    shard: tuple[int, int] | None = None,
    on_batch=None,
) -> ScanResult:
    """Scan `files` (or a shard of them) with `workers` processes (1: in this process)."""
    result = ScanResult(len(index.pair_entry), sources=[str(f) for f in files])
    started = time.perf_counter()
    jobs = iter_jobs(files, batch_bytes, shard)
    # Starting processes costs seconds: not worth it for less than a batch per worker.
    workers = min(workers, max(1, sum(f.stat().st_size for f in files) // batch_bytes))
    if workers <= 1:
        for job in jobs:
            result.add(scan_job(job, index, text_field))
            if on_batch:
                on_batch(job)
    else:
        # spawn: safe whatever threads the parent holds; each worker loads the saved index once.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker,
            initargs=(str(index_path), text_field),
        ) as pool:  # fmt: skip
            pending: deque = deque()
            for job in jobs:
                pending.append(pool.submit(scan_job, job))
                if len(pending) >= 2 * workers:  # bounded: never the whole corpus in flight
                    result.add(pending.popleft().result())
                if on_batch:
                    on_batch(job)
            while pending:
                result.add(pending.popleft().result())
    result.stats["seconds"] = round(time.perf_counter() - started, 3)
    return result
