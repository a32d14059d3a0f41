"""`hanlm shards`: the corpus tokenised into NumPy memmap files, on the data engine.

One corpus part is one task of the engine's `encode` job (hanlm.data.engine: local worker
processes, Slurm or Ray, `[data_engine] workers` at once) and gives `train-NNNNN.bin`,
`val-NNNNN.bin` and a sidecar `part-NNNNN.json` written last, in the stage's work folder
(`shards.work/encode/`). A finished task leaves the engine's completion marker, so a killed run
redoes only the parts without one; a marked part whose token files no longer have the size and
sha256 its sidecar records is encoded again too. When every task is done the stage's process
moves the files into `shards/` and writes `manifest.json` from the sidecars. Documents are
separated by the end-of-document token; the train/val split is decided per document by a seeded
hash of its id, so nothing depends on the number of workers. Each worker process loads the
tokenizer once and encodes on one thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import zstandard
from datatrove.pipeline.base import PipelineStep
from tokenizers import Tokenizer

from hanlm.chat_template import SPECIAL_TOKENS_FILE
from hanlm.config import DataEngineSection, ShardsSection
from hanlm.console import info, warn
from hanlm.data import engine
from hanlm.data.corpus import STATS_FILE, corpus_parts, iter_part, part_sources
from hanlm.data.manifest import MANIFEST_FORMAT, MANIFEST_NAME
from hanlm.data.tokenizer import text_pieces
from hanlm.errors import UserError
from hanlm.files import (
    atomic_write_json,
    damaged_files,
    file_mismatch,
    file_record,
    fsync_dir,
    read_json,
)
from hanlm.results import Part, Result
from hanlm.streams import open_text_stream

STAGE = "shards"
SPLITS = ("train", "val")
ENCODE = "encode"  # the engine job, and its folder of task outputs in the work folder
# One thread per worker: N workers use N cores, and rayon must not start after a fork.
THREAD_VARIABLES = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def is_val(doc_id: str, seed: int, val_fraction: float) -> bool:
    """A seeded, order-free coin per document: the split never depends on who encodes it."""
    digest = hashlib.blake2b(f"{seed}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < val_fraction


# ---------------------------------------------------------------------------------------------
# Task side: imports only numpy and tokenizers, never torch.

# One tokenizer per worker process, kept between the tasks it runs: (sha256, Tokenizer).
_worker_tokenizer: tuple[str, Tokenizer] | None = None


def _tokenizer(path: str, sha: str) -> Tokenizer:
    global _worker_tokenizer
    if _worker_tokenizer is None or _worker_tokenizer[0] != sha:
        _worker_tokenizer = (sha, Tokenizer.from_file(path))
    return _worker_tokenizer[1]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One tokenizers (rayon) thread: N workers use N cores, and rayon must not start after a
    fork. The variables are restored after, for a task run inside the stage's own process."""
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    os.environ.update(THREAD_VARIABLES)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _encoded(
    tok: Tokenizer, job: dict, dtype: np.dtype, counter: engine.TaskCounter | None
) -> Iterator[tuple[dict, list[np.ndarray], int]]:
    """(document, its token ids in one or more arrays, its UTF-8 bytes) of each document of the
    job's part, in order. The tokenizer gets at most `batch_docs` documents and `piece_chars`
    characters at a time (it holds ~250 bytes per character it encodes); a longer document goes
    in pieces cut where the pieces' tokens are the whole text's (tokenizer.text_pieces)."""
    batch: list[dict] = []
    chars = 0

    def flush() -> Iterator[tuple[dict, list[np.ndarray], int]]:
        # no token of the tokenizer's own (a BOS): encode_part places the document's ends
        encodings = tok.encode_batch_fast([d["text"] for d in batch], add_special_tokens=False)
        nbytes = 0
        for doc, enc in zip(batch, encodings, strict=True):
            size = len(doc["text"].encode("utf-8"))
            nbytes += size
            yield doc, [np.array(enc.ids, dtype=dtype)], size
        if counter is not None:  # progress counts characters: the corpus's stats give a total
            counter.add(len(batch), nbytes, units=chars)

    for doc in iter_part(Path(job["part"])):
        doc_chars = len(doc["text"])
        if batch and (len(batch) == job["batch_docs"] or chars + doc_chars > job["piece_chars"]):
            yield from flush()
            batch, chars = [], 0
        if doc_chars <= job["piece_chars"]:
            batch.append(doc)
            chars += doc_chars
            continue
        arrays, size = [], 0
        for piece in text_pieces(doc["text"], job["piece_chars"]):
            ids = tok.encode_batch_fast([piece], add_special_tokens=False)[0].ids
            arrays.append(np.array(ids, dtype=dtype))
            nbytes = len(piece.encode("utf-8"))
            size += nbytes
            if counter is not None:
                counter.add(0, nbytes, units=len(piece))
        if counter is not None:
            counter.add(1, 0, units=0)
        yield doc, arrays, size
    if batch:
        yield from flush()


class _TokenFile:
    """One split's token file, written as the documents are encoded (about FLUSH_TOKENS tokens
    a write) under a temporary name and renamed when whole: its size, sha256 and the counts of
    the special tokens are taken on the way, so a part's tokens are never all in memory. A
    failed write names the token file, as atomic_write_bytes does."""

    FLUSH_TOKENS = 1 << 20

    def __init__(self, path: Path, special_ids: np.ndarray):
        self.path, self.special_ids = path, special_ids
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._sha = hashlib.sha256()
        self._pending: list[np.ndarray] = []
        self._pending_tokens = self.size = 0
        self.special_counts = np.zeros(len(special_ids), dtype=np.int64)
        with self._named():
            self._file = open(self.tmp, "wb")  # noqa: SIM115 - closed in close() or discard()

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:  # named by the file the task writes, not the temporary one
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def write(self, arrays: list[np.ndarray]) -> None:
        for a in arrays:
            self._pending.append(a)
            self._pending_tokens += len(a)
        if self._pending_tokens >= self.FLUSH_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        tokens = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_tokens = [], 0
        data = tokens.tobytes()
        with self._named():
            self._file.write(data)
        self._sha.update(data)
        self.size += len(data)
        hist = np.bincount(tokens, minlength=int(self.special_ids.max()) + 1)
        self.special_counts += hist[self.special_ids]

    def close(self) -> dict:
        """In place under its name, flushed to disk; its size and sha256."""
        self._flush()
        with self._named():
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return {"size": self.size, "sha256": self._sha.hexdigest()}

    def discard(self) -> None:
        """After a failure: the temporary file removed (a finished file stays)."""
        with contextlib.suppress(OSError):
            self._file.close()
            self.tmp.unlink(missing_ok=True)


class _DocumentIndex:
    """Where each document of a token file starts, with its id and its source's metadata: one
    zstd JSONL line per document, {"id", "start", "metadata"?}, so a training window can be
    traced to its document and a document to its source's row. Written as the documents are
    encoded, under a temporary name renamed when whole; its size and sha256 are taken on the
    way, as the token file's are."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._file = open(self.tmp, "wb")  # noqa: SIM115 - closed in close() or discard()
        self._writer = zstandard.ZstdCompressor(level=3).stream_writer(self._file, closefd=False)

    def write(self, doc: dict, start: int) -> None:
        record = {"id": doc["id"], "start": start}
        if doc.get("metadata"):
            record["metadata"] = doc["metadata"]
        self._writer.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))

    def close(self) -> dict:
        self._writer.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        return file_record(self.path) | {"path": self.path.name}

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self.tmp.unlink(missing_ok=True)


def index_name(token_file: str) -> str:
    """The document index beside token file `train-00003.bin`: train-00003.docs.jsonl.zst."""
    return token_file.removesuffix(".bin") + ".docs.jsonl.zst"


def encode_part(tok: Tokenizer, job: dict, counter: engine.TaskCounter | None = None) -> dict:
    """Tokenise one corpus part into its train and val files; returns the sidecar it wrote
    (last, after both token files). Memory: what the tokenizer holds for `piece_chars`
    characters, plus the longest document's text and tokens, whatever the part's size."""
    eod, dtype = job["eod_id"], np.dtype(job["dtype"])
    out_dir = Path(job["out_dir"])
    special_ids = np.asarray(job["special_ids"], dtype=np.int64)
    files: dict[str, _TokenFile] = {}
    indexes: dict[str, _DocumentIndex] = {}
    end = np.array([eod], dtype=dtype)
    # a model's own BOS where its tokenizer adds one (continued pretraining), else nothing
    start = [] if job.get("start_id") is None else [np.array([job["start_id"]], dtype=dtype)]
    counts = {s: {"tokens": 0, "documents": 0, "bytes": 0} for s in SPLITS}
    first = job["first_of_source"]
    try:
        for split in SPLITS:
            name = f"{split}-{job['index']:05d}.bin"
            files[split] = _TokenFile(out_dir / name, special_ids)
            indexes[split] = _DocumentIndex(out_dir / index_name(name))
        for doc, arrays, size in _encoded(tok, job, dtype, counter):
            val = job["val_fraction"] > 0 and (
                first or is_val(doc["id"], job["seed"], job["val_fraction"])
            )
            first = False  # a source's first document goes to val: each source has val loss
            split = "val" if val else "train"
            indexes[split].write(doc, counts[split]["tokens"])
            files[split].write([*start, *arrays, end])
            split_counts = counts[split]
            split_counts["tokens"] += sum(len(a) for a in arrays) + len(start) + 1
            split_counts["documents"] += 1
            split_counts["bytes"] += size
        if counter is not None:
            counter.flush()
        # size and checksum: a resumed run reuses a file only if it still matches them
        records = {split: files[split].close() for split in SPLITS}
        index_records = {split: indexes[split].close() for split in SPLITS}
    except BaseException:
        for f in [*files.values(), *indexes.values()]:
            f.discard()
        raise
    sidecar: dict = {"part": Path(job["part"]).name, "tokenizer_sha256": job["tokenizer_sha256"]}
    for split in SPLITS:
        sidecar[split] = {
            "path": files[split].path.name, "source": job["source"], **counts[split],
            **records[split], "documents_index": index_records[split],
        }  # fmt: skip
        if split == "train":
            sidecar["special_token_counts"] = files["train"].special_counts.tolist()
    atomic_write_json(out_dir / sidecar_name(job["index"]), sidecar)
    return sidecar


def sidecar_name(index: int) -> str:
    return f"part-{index:05d}.json"


class EncodeParts(PipelineStep):
    """Task `rank` encodes corpus part `rank` (see encode_part): it writes only its own token
    files and sidecar, which the stage's process gathers into the manifest."""

    name = "🔢 encode"
    type = "🔢 - TOKENIZE"

    def __init__(self, jobs: list[dict], tokenizer_json: Path, work: Path):
        super().__init__()
        self.jobs, self.tokenizer_json, self.work = jobs, str(tokenizer_json), str(work)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        job = self.jobs[rank]
        Path(job["out_dir"]).mkdir(parents=True, exist_ok=True)
        counter = engine.TaskCounter(self.work, ENCODE, rank)
        with one_thread():
            tok = _tokenizer(self.tokenizer_json, job["tokenizer_sha256"])
            sidecar = encode_part(tok, job, counter)
        for split in SPLITS:
            self.stat_update(f"{split}_tokens", value=sidecar[split]["tokens"])
        return iter(())


# ---------------------------------------------------------------------------------------------
# The stage's process


def _special_tokens(tokenizer_dir: Path) -> tuple[dict[str, int], dict]:
    """(every special token's id by its text, special_tokens.json): hanlm's own tokenizer's, or
    the one continued pretraining keeps (hanlm.data.base_tokenizer)."""
    spec = read_json(tokenizer_dir / SPECIAL_TOKENS_FILE)
    names = {v["token"]: v["id"] for k, v in spec.items() if isinstance(v, dict) and "id" in v}
    names.update({r["token"]: r["id"] for r in spec["reserved"]})
    return dict(sorted(names.items(), key=lambda kv: kv[1])), spec


def document_ends(spec: dict) -> tuple[int, int | None]:
    """(the token that ends a document, the one that begins it or None): hanlm's tokenizers
    end with <|endoftext|> and begin with nothing; a model's own, with its eos, and its BOS
    where its tokenizer adds one."""
    start = spec.get("document_start")
    return spec["eod"]["id"], None if start is None else start["id"]


def _reusable_part(encoded: Path, index: int, sha: str) -> dict | None:
    """The sidecar of a part a task finished, or None when the part must be encoded again:
    no sidecar, another tokenizer, or a token file whose size or checksum differs from what
    was written."""
    path = encoded / sidecar_name(index)
    if not path.is_file():
        problems = [f"{path.name} is missing"]
    else:
        try:
            sidecar = read_json(path)
            entries = [sidecar[s] for s in SPLITS]
            entries += [e["documents_index"] for e in entries]
            problems = [
                file_mismatch(encoded / e["path"], e)
                if "sha256" in e
                else f"{e['path']} has no checksum"
                for e in entries
            ]
            if sidecar["tokenizer_sha256"] != sha:
                problems.append(f"{path.name} names another tokenizer")
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            problems = [f"{path.name} cannot be read"]
    problems = [p for p in problems if p]
    if problems:
        warn(f"shards: part {index} is encoded again: {'; '.join(problems)}")
        return None
    return sidecar


def _recheck_finished(work: Path, job: engine.Job, encoded: Path, sha: str) -> int:
    """Tasks an earlier run finished keep their completion marker only while their files
    still check out (size and sha256); the others run again. How many are kept."""
    pending = set(engine.incomplete_tasks(work, job))
    finished = [rank for rank in range(job.tasks) if rank not in pending]
    damaged = [rank for rank in finished if _reusable_part(encoded, rank, sha) is None]
    engine.forget_tasks(work, job, damaged)
    return len(finished) - len(damaged)


class IndexFile(Part):
    """A token file's document index (see _DocumentIndex) and what a reuse checks."""

    path: str
    size: int
    sha256: str


class ShardFile(Part):
    """One token file: its corpus source, tokens, documents and text bytes, what a reuse
    checks, and its document index."""

    path: str
    source: str
    tokens: int
    documents: int
    bytes: int
    size: int
    sha256: str
    documents_index: IndexFile


class SplitShards(Part):
    files: list[ShardFile]
    tokens: int
    documents: int
    bytes: int


class SourceShards(Part):
    """One corpus source's tokens and documents in each split."""

    train_tokens: int
    train_documents: int
    val_tokens: int
    val_documents: int


class ShardsManifest(Result):
    """`shards/manifest.json`: the token files of each split, the tokenizer they were encoded
    with (by sha256), and how often each special token occurs in them."""

    FILE = MANIFEST_NAME
    MADE_BY = "shards"

    format: int
    dtype: str
    vocab_size: int
    tokenizer_sha256: str
    eod_id: int
    splits: dict[str, SplitShards]
    sources: dict[str, SourceShards]  # in the corpus's order of sources
    special_token_counts: dict[str, int]
    seconds: float
    workers: int


def damaged_outputs(out: Path) -> list[str]:
    """What is wrong with the token files of a finished shards folder (each file's size, from
    its token count, and its sha256: see files.damaged_files), or an empty list."""
    try:
        manifest = ShardsManifest.read(out / MANIFEST_NAME)
        dtype = np.dtype(manifest.dtype)
        entries = [f for split in SPLITS for f in manifest.splits[split].files]
        records = [{**e.model_dump(), "size": e.tokens * dtype.itemsize} for e in entries]
        records += [e.documents_index.model_dump() for e in entries]
    except (UserError, TypeError, KeyError):
        return ["manifest.json cannot be read"]
    return damaged_files(out, records)


SOURCE_KEYS = tuple(f"{split}_{what}" for split in SPLITS for what in ("tokens", "documents"))


def _manifest(
    sidecars: list[dict], vocab_size: int, dtype: np.dtype, sha: str, special: dict, spec: dict
) -> dict:
    splits = {}
    for split in SPLITS:
        files = [s[split] for s in sidecars if s[split]["tokens"] > 0]
        splits[split] = {
            "files": files,
            **{k: sum(f[k] for f in files) for k in ("tokens", "documents", "bytes")},
        }
    sources: dict[str, dict] = {}
    for sidecar in sidecars:
        source = sources.setdefault(sidecar["train"]["source"], dict.fromkeys(SOURCE_KEYS, 0))
        for split in SPLITS:
            source[f"{split}_tokens"] += sidecar[split]["tokens"]
            source[f"{split}_documents"] += sidecar[split]["documents"]
    totals = np.sum([s["special_token_counts"] for s in sidecars], axis=0)
    return {
        "format": MANIFEST_FORMAT,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "tokenizer_sha256": sha,
        "eod_id": document_ends(spec)[0],
        "splits": splits,
        "sources": sources,
        "special_token_counts": {t: int(n) for t, n in zip(special, totals, strict=True)},
    }


def _corpus_characters(corpus_dir: Path, parts: list[Path]) -> int:
    """The characters of the corpus's parts as its stats.json lists them; 0 when unknown."""
    try:
        listed = {p["path"]: p["characters"] for p in read_json(corpus_dir / STATS_FILE)["parts"]}
        return sum(listed[p.name] for p in parts)
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def encode_corpus(
    corpus_dir: Path,
    tokenizer_json: Path,
    sha: str,
    shards_cfg: ShardsSection,
    seed: int,
    engine_cfg: DataEngineSection,
    work: Path,
    out: Path,
) -> ShardsManifest | None:
    """Encode every part of a corpus folder on the data engine, one task per part, in the
    work folder `work` (see engine.prepare_work_dir: the tasks an interrupted run of the same
    settings finished are kept), then move the token files and sidecars into `out` and write
    its manifest.json. The manifest; None when the tasks were submitted to a cluster and still
    run (running the stage again then gathers them)."""
    tokenizer_dir = tokenizer_json.parent
    parts = corpus_parts(corpus_dir)
    if not parts:
        raise UserError(f"no corpus parts in {corpus_dir}", fix="run `hanlm corpus` first")
    special, spec = _special_tokens(tokenizer_dir)
    vocab_size = spec["vocab_size"]
    eod, document_start = document_ends(spec)
    dtype = token_dtype(vocab_size)
    encoded = Path(work) / ENCODE
    source_of = part_sources(corpus_dir)
    firsts = {source_of[p.name]: i for i, p in reversed(list(enumerate(parts)))}
    jobs = [
        {
            "part": str(p),
            "index": i,
            "source": source_of[p.name],
            "first_of_source": firsts[source_of[p.name]] == i,
            "out_dir": str(encoded),
            "eod_id": eod,
            "start_id": document_start,
            "dtype": dtype.name,
            "val_fraction": shards_cfg.val_fraction,
            "seed": seed,
            "batch_docs": shards_cfg.batch_docs,
            "piece_chars": shards_cfg.piece_chars,
            "special_ids": list(special.values()),
            "tokenizer_sha256": sha,
        }
        for i, p in enumerate(parts)
    ]
    job = engine.Job(ENCODE, [EncodeParts(jobs, tokenizer_json, work)], tasks=len(jobs))
    kept = _recheck_finished(work, job, encoded, sha)
    if kept:
        info(f"shards: resuming, {kept} of {len(jobs)} parts already encoded")
    # the parts' characters, from the corpus's stats.json where there is one (else tasks done)
    progress = engine.Progress(work, "shards", {ENCODE: _corpus_characters(corpus_dir, parts)})
    started = time.perf_counter()
    with one_thread():  # forked workers inherit it: no rayon pool, no tokenizers fork warning
        if not engine.run_jobs([job], engine_cfg, work, progress=progress):
            return None
    seconds = time.perf_counter() - started
    sidecars = [read_json(encoded / sidecar_name(i)) for i in range(len(jobs))]
    manifest = _manifest(sidecars, vocab_size, dtype, sha, special, spec)
    if manifest["splits"]["train"]["tokens"] == 0:
        raise UserError(f"no training tokens from {corpus_dir}", fix="give the corpus more text")
    manifest["seconds"] = round(seconds, 3)
    manifest["workers"] = (
        min(engine.local_workers(engine_cfg), len(jobs))
        if engine_cfg.executor == "local"
        else engine_cfg.workers
    )
    out = Path(out)
    for sidecar in sidecars:
        for split in SPLITS:
            for name in (sidecar[split]["path"], sidecar[split]["documents_index"]["path"]):
                os.replace(encoded / name, out / name)
    for i in range(len(jobs)):
        os.replace(encoded / sidecar_name(i), out / sidecar_name(i))
    return ShardsManifest.model_validate(manifest)  # the pipeline keeps it as MANIFEST_NAME


def trace(shards_dir: Path, token_file: str, token: int) -> dict:
    """The document holding token number `token` of token file `token_file` (a name the
    manifest lists, e.g. train-00003.bin): {"id", "start", "metadata"?, "source"}: the way from
    a training window back to its document and, through its id and metadata, its source row."""
    manifest = ShardsManifest.read(Path(shards_dir) / MANIFEST_NAME)
    entry = next(
        (f for split in SPLITS for f in manifest.splits[split].files if f.path == token_file),
        None,
    )
    if entry is None or not 0 <= token < entry.tokens:
        raise UserError(
            f"{token_file} has no token {token:,} in {shards_dir}",
            fix="name a token file of manifest.json and a token below its `tokens`",
        )
    found = None
    with open_text_stream(Path(shards_dir) / entry.documents_index.path) as stream:
        for line in stream:
            record = json.loads(line)
            if record["start"] > token:
                break
            found = record
    return {**found, "source": entry.source}
