"""`hanlm corpus`: raw text in, normalised and deduplicated documents out.

Reads .txt / .jsonl / .parquet files (optionally .gz or .zst), Hugging Face dataset ids and the
built-in demo world; normalises to Unicode NFC (NFKC and NFD break Hangul syllables or
compatibility jamo such as ㅋㅋ), removes control characters, drops short documents and exact (and
optionally near-) duplicates, and writes zstd-compressed JSONL parts plus `stats.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import zstandard

from hanlm.config import CorpusSection
from hanlm.console import progress, warn
from hanlm.data.readers import Document, Skips, read_source
from hanlm.errors import UserError
from hanlm.files import file_mismatch, file_record, open_text_stream, read_json

STAGE = "corpus"
STATS_FILE = "stats.json"
PART_GLOB = "part-*.jsonl.zst"

# C0/C1 controls except tab and newline, plus the byte-order mark and Unicode non-characters.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff\ufffe\uffff]")


def normalise(text: str) -> str:
    """NFC, unified newlines, no control characters, no surrounding whitespace."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text)
    return _CONTROL.sub("", text).strip()


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
