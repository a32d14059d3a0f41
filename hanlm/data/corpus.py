"""`hanlm corpus`: raw text in, normalised and deduplicated documents out.

Reads .txt / .jsonl / .parquet files (optionally .gz or .zst), Hugging Face dataset ids and the
built-in demo world; normalises to Unicode NFC (NFKC and NFD break Hangul syllables or
compatibility jamo such as ㅋㅋ), removes control characters, drops short documents and exact (and
optionally near-) duplicates, and writes zstd-compressed JSONL parts plus `stats.json`.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from hanlm.config import CorpusSection
from hanlm.console import progress, warn
from hanlm.errors import UserError
from hanlm.files import (
    DamagedCompressedFile,
    file_mismatch,
    file_record,
    open_text_stream,
    read_json,
    strip_compression_suffix,
)

STAGE = "corpus"
STATS_FILE = "stats.json"
PART_GLOB = "part-*.jsonl.zst"
SUPPORTED = ".txt, .jsonl, .parquet (each optionally .gz or .zst), hf:NAME[:CONFIG]:SPLIT, demo"

# C0/C1 controls except tab and newline, plus the byte-order mark and Unicode non-characters.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff\ufffe\uffff]")


def normalise(text: str) -> str:
    """NFC, unified newlines, no control characters, no surrounding whitespace."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text)
    return _CONTROL.sub("", text).strip()


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class Skips:
    """Input records (a JSONL line, a .txt document, a parquet row) skipped, by reason."""

    strict: bool
    counts: Counter = field(default_factory=Counter)
    damaged: list[dict] = field(default_factory=list)  # files that could not be read to the end

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        if self.strict:
            raise UserError(
                f"{reason.replace('_', ' ')}{': ' + detail if detail else ''}",
                where=where,
                fix="repair or remove the record, or run without --strict to skip and count it",
            )
        self.counts[reason] += 1

    def damaged_file(self, path: str, detail: str) -> None:
        """A file that cannot be read to its end: what was read before the damage is kept."""
        if self.strict:
            raise UserError(
                f"the input file cannot be read to its end: {detail}",
                where=path,
                fix="copy or download it again (`gzip -t` or `zstd -t` checks a compressed file) "
                "or leave it out; without --strict it is skipped, counted in stats.json, and the "
                "documents read before the damage are kept",
            )
        self.counts["corrupt_file"] += 1
        self.damaged.append({"path": path, "error": detail})


@dataclass(frozen=True)
class Document:
    id: str
    text: str


def _decode(raw: bytes, skips: Skips, where: str) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        skips.skip("invalid_utf8", where, str(e))
        return None


def _read_jsonl(path: Path, text_field: str, skips: Skips) -> Iterator[Document]:
    with open_text_stream(path) as stream:
        for line_no, raw in enumerate(stream, start=1):
            where = f"{path}:{line_no}"
            line = _decode(raw, skips, where)
            if line is None or not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                skips.skip("corrupt_json", where, str(e))
                continue
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                skips.skip("missing_field", where, f"no string field {text_field!r}")
                continue
            doc_id = record.get("id")
            yield Document(str(doc_id) if doc_id is not None else f"{path.name}:{line_no}", text)


def _read_txt(path: Path, doc_per_line: bool, skips: Skips) -> Iterator[Document]:
    with open_text_stream(path) as stream:
        block: list[bytes] = []
        start = 1
        for line_no, raw in enumerate(stream, start=1):
            if doc_per_line:
                line = _decode(raw, skips, f"{path}:{line_no}")
                if line is not None and line.strip():
                    yield Document(f"{path.name}:{line_no}", line)
                continue
            if raw.strip():
                if not block:
                    start = line_no
                block.append(raw)
                continue
            if block:
                text = _decode(b"".join(block), skips, f"{path}:{start}")
                if text is not None:
                    yield Document(f"{path.name}:{start}", text)
                block = []
        if block:
            text = _decode(b"".join(block), skips, f"{path}:{start}")
            if text is not None:
                yield Document(f"{path.name}:{start}", text)


def _read_parquet(path: Path, text_field: str, skips: Skips) -> Iterator[Document]:
    import pyarrow.parquet as pq  # deferred: pyarrow is heavy and only parquet inputs need it

    if strip_compression_suffix(path.name) != path.name:
        with open_text_stream(path) as stream:
            source = io.BytesIO(stream.read())  # parquet needs random access
    else:
        source = path
    try:
        pf = pq.ParquetFile(source)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a damaged file
        raise UserError(f"cannot read parquet file: {e}", where=str(path)) from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise UserError(
            f"parquet file has no column {text_field!r}",
            where=str(path),
            fix=f"choose one of its columns with --text-field: {', '.join(names)}",
        )
    row = 0
    for batch in pf.iter_batches(columns=[text_field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            row += 1
            where = f"{path}:row {row}"
            if isinstance(value, bytes):
                value = _decode(value, skips, where)
                if value is None:
                    continue
            if not isinstance(value, str):
                skips.skip("missing_field", where, f"{text_field!r} is empty or not text")
                continue
            yield Document(f"{path.name}:{row}", value)


def _read_hf(spec: str, text_field: str, skips: Skips) -> Iterator[Document]:
    parts = spec[len("hf:") :].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise UserError(
            f"bad Hugging Face dataset id {spec!r}",
            fix="write it as hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT",
        )
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    try:
        import datasets  # deferred: optional (hanlm[hf]) and heavy
    except ImportError:
        raise UserError(
            f"reading {spec} needs the `datasets` package", fix="pip install 'hanlm[hf]'"
        ) from None
    offline_fix = (
        f"on a machine that is online, save it with datasets (load_dataset({name!r}"
        f"{', ' + repr(config) if config else ''}, split={split!r}).to_parquet('data.parquet')) "
        "and pass the file with --input"
    )
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise UserError(f"{spec} cannot be streamed: Hugging Face is set offline", fix=offline_fix)
    try:
        dataset = datasets.load_dataset(name, config, split=split, streaming=True)
        for row, record in enumerate(dataset, start=1):
            text = record.get(text_field)
            if not isinstance(text, str):
                skips.skip("missing_field", f"{spec}:row {row}", f"no string field {text_field!r}")
                continue
            yield Document(f"{name}:{split}:{row}", text)
    except UserError:
        raise
    except Exception as e:  # network, authentication or a missing dataset: all need the user
        raise UserError(
            f"could not stream {spec}: {type(e).__name__}: {e}", fix=offline_fix
        ) from None


def expand_inputs(inputs: list[str]) -> list[str | Path]:
    """Globs become sorted file lists; `hf:` ids and `demo` pass through. No match is an error."""
    if not inputs:
        raise UserError("no corpus inputs given", fix=f"pass --input with one of: {SUPPORTED}")
    expanded: list[str | Path] = []
    for spec in inputs:
        if spec == "demo" or spec.startswith("hf:"):
            expanded.append(spec)
            continue
        matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            raise UserError(
                f"corpus input {spec!r} matches no file",
                fix="check the path or glob pattern (quote it so the shell does not expand it)",
            )
        for path in files:
            kind = Path(strip_compression_suffix(path.name)).suffix.lower()
            if kind not in (".txt", ".jsonl", ".parquet"):
                raise UserError(
                    f"unsupported corpus file type {path.name!r}",
                    where=str(path),
                    fix=f"supported inputs are {SUPPORTED}",
                )
        expanded.extend(files)
    return expanded


def read_source(
    source: str | Path, c: CorpusSection, skips: Skips, *, demo_file: Path | None = None
) -> Iterator[Document]:
    """The documents of one input; `demo` is read from `demo_file` (the demo world's pretraining
    text, which the caller has written)."""
    if source == "demo":
        yield from _read_jsonl(demo_file, "text", skips)
        return
    if isinstance(source, str):
        yield from _read_hf(source, c.text_field, skips)
        return
    kind = Path(strip_compression_suffix(source.name)).suffix.lower()
    try:
        if kind == ".txt":
            yield from _read_txt(source, c.doc_per_line, skips)
        elif kind == ".jsonl":
            yield from _read_jsonl(source, c.text_field, skips)
        else:
            yield from _read_parquet(source, c.text_field, skips)
    except DamagedCompressedFile as e:  # truncated or failing its checksum
        skips.damaged_file(str(source), e.detail)
    except OSError as e:  # unreadable part-way (an I/O error)
        skips.damaged_file(str(source), f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# Deduplication


class NearDuplicateFilter:
    """MinHash LSH over character shingles of the whitespace-free text (Korean spacing varies)."""

    def __init__(self, threshold: float, num_perm: int, ngram: int, seed: int):
        from datasketch import MinHash, MinHashLSH  # deferred: pulls in scipy; near_dedup only

        self._minhash = MinHash
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self._num_perm, self._ngram, self._seed = num_perm, ngram, seed
        self._count = 0

    def is_duplicate(self, text: str) -> bool:
        compact = "".join(text.split())
        n = self._ngram
        shingles = {compact[i : i + n] for i in range(max(1, len(compact) - n + 1))}
        m = self._minhash(num_perm=self._num_perm, seed=self._seed)
        m.update_batch([s.encode("utf-8") for s in shingles])
        if self._lsh.query(m):
            return True
        self._lsh.insert(str(self._count), m)
        self._count += 1
        return False


# ---------------------------------------------------------------------------------------------
# Writing


class PartWriter:
    """Compressed JSONL parts of about `part_chars` characters each."""

    def __init__(self, out_dir: Path, part_chars: int):
        self._compressor = zstandard.ZstdCompressor(level=3)
        self.out_dir, self.part_chars = out_dir, part_chars
        self.parts: list[dict] = []
        self._file = self._writer = None
        self._docs = self._chars = 0

    def _open(self) -> None:
        path = self.out_dir / f"part-{len(self.parts):05d}.jsonl.zst"
        self._file = open(path, "wb")  # noqa: SIM115 - closed in _close
        self._writer = self._compressor.stream_writer(self._file)
        self.parts.append({"path": path.name, "documents": 0, "characters": 0})
        self._docs = self._chars = 0

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.flush(1)  # zstd FLUSH_FRAME: end the frame before closing
            self._file.flush()
            os.fsync(self._file.fileno())
            self._writer.close()
            path = self.out_dir / self.parts[-1]["path"]
            self.parts[-1].update(documents=self._docs, characters=self._chars, **file_record(path))
            self._file = self._writer = None

    def write(self, doc: Document) -> None:
        if self._writer is None:
            self._open()
        line = json.dumps({"id": doc.id, "text": doc.text}, ensure_ascii=False) + "\n"
        self._writer.write(line.encode("utf-8"))
        self._docs += 1
        self._chars += len(doc.text)
        if self._chars >= self.part_chars:
            self._close()

    def close(self) -> list[dict]:
        self._close()
        return self.parts


# ---------------------------------------------------------------------------------------------
# Cleaning: every source through normalisation, length and duplicate filters into parts


def input_fingerprint(sources: list[str | Path]) -> list:
    """What stands for the inputs' content: each file's resolved path, size and time."""
    out: list = []
    for s in sources:
        if isinstance(s, Path):
            st = s.stat()
            out.append([str(s.resolve()), st.st_size, st.st_mtime_ns])
        else:
            out.append(s)
    return out


class _Cleaner:
    """Normalise each document, drop short and (exact or near) duplicate ones, count why."""

    def __init__(self, c: CorpusSection, seed: int):
        self.min_chars = c.min_chars
        self.seen: set[bytes] = set()
        self.near = (
            NearDuplicateFilter(
                c.near_dedup_threshold, c.near_dedup_num_perm, c.near_dedup_ngram, seed
            )
            if c.near_dedup
            else None
        )
        self.stats = Counter()

    def clean(self, doc: Document) -> Document | None:
        """The document to keep (normalised), or None with the reason counted."""
        stats = self.stats
        stats["documents_in"] += 1
        stats["characters_in"] += len(doc.text)
        text = normalise(doc.text)
        if len(text) < self.min_chars:
            stats["too_short"] += 1
            return None
        key = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
        if key in self.seen:
            stats["exact_duplicates"] += 1
            return None
        self.seen.add(key)
        if self.near is not None and self.near.is_duplicate(text):
            stats["near_duplicates"] += 1
            return None
        stats["documents_out"] += 1
        stats["characters_out"] += len(text)
        return Document(doc.id, text)


def build(
    sources: list[str | Path],
    c: CorpusSection,
    seed: int,
    out: Path,
    skips: Skips,
    *,
    demo_file: Path | None = None,
) -> dict:
    """Clean every source into compressed parts in `out`; the stats (stats.json's content).

    A corpus with no document left is a UserError naming why."""
    cleaner = _Cleaner(c, seed)
    stats = cleaner.stats
    started = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("corpus", total=None)
        writer = PartWriter(out, c.part_chars)
        for source in sources:
            documents_before = stats["documents_in"]
            damaged_before = len(skips.damaged)
            for doc in read_source(source, c, skips, demo_file=demo_file):
                bar.advance(task)
                kept = cleaner.clean(doc)
                if kept is not None:
                    writer.write(kept)
            if len(skips.damaged) > damaged_before:
                skips.damaged[-1]["documents_kept"] = stats["documents_in"] - documents_before
        parts = writer.close()
    if stats["documents_out"] == 0:
        _raise_empty(stats, skips, c.inputs)
    return {
        "inputs": [str(s) for s in sources],
        **{
            k: stats[k]
            for k in ("documents_in", "characters_in", "documents_out", "characters_out")
        },
        "too_short": stats["too_short"],
        "exact_duplicates": stats["exact_duplicates"],
        "near_duplicates": stats["near_duplicates"] if cleaner.near else None,
        "skipped": dict(sorted(skips.counts.items())),
        "damaged_files": skips.damaged,
        "parts": parts,
        "seconds": round(time.perf_counter() - started, 3),
    }


def warn_skipped(skips: Skips) -> None:
    """Say which inputs were damaged and which records were skipped (without --strict)."""
    for damaged in skips.damaged:
        warn(
            f"corpus: {damaged['path']} is damaged ({damaged['error']}); skipped after "
            f"{damaged['documents_kept']:,} documents (use --strict to fail instead)"
        )
    records = {k: n for k, n in skips.counts.items() if k != "corrupt_file"}
    if records:
        warn(f"corpus: skipped records {records} (use --strict to fail instead)")


def _raise_empty(stats: Counter, skips: Skips, inputs: list[str]) -> None:
    records = sum(n for k, n in skips.counts.items() if k != "corrupt_file")
    what = (
        f"the corpus is empty after cleaning ({stats['documents_in']} documents read, "
        f"{stats['too_short']} too short, {records} records skipped"
    )
    fix = "check --input, --text-field and corpus.min_chars"
    if skips.damaged:
        named = "; ".join(f"{d['path']}: {d['error']}" for d in skips.damaged[:3])
        more = f" and {len(skips.damaged) - 3} more" if len(skips.damaged) > 3 else ""
        what += f", {len(skips.damaged)} damaged input files ({named}{more})"
        fix = (
            "copy or download the damaged files again (`gzip -t` or `zstd -t` checks one), "
            "or leave them out; " + fix
        )
    raise UserError(what + ")", where=", ".join(inputs), fix=fix)


# ---------------------------------------------------------------------------------------------
# Reading a corpus folder (tokenizer, shards and decontam use these)


def damaged_parts(corpus_dir: Path) -> list[str]:
    """What is wrong with the parts a finished corpus folder's stats.json lists (their sizes;
    see file_mismatch), or an empty list."""
    try:
        parts = read_json(Path(corpus_dir) / STATS_FILE)["parts"]
        return [
            problem
            for part in parts
            if (problem := file_mismatch(Path(corpus_dir) / part["path"], part, checksum=False))
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return ["stats.json cannot be read"]


def corpus_parts(corpus_dir: Path) -> list[Path]:
    return sorted(Path(corpus_dir).glob(PART_GLOB))


def iter_part(path: Path) -> Iterator[dict]:
    with open_text_stream(path) as stream:
        for line in stream:
            yield json.loads(line)


def iter_corpus(corpus_dir: Path) -> Iterator[dict]:
    for part in corpus_parts(corpus_dir):
        yield from iter_part(part)
