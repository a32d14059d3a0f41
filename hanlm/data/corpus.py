"""A corpus folder: zstd-compressed JSONL parts (`{"id", "text"}`) plus `stats.json`.

What `hanlm corpus` writes (hanlm.data.cleaning builds it) and the tokenizer, shards and
decontamination stages read. Text in it is NFC (NFKC and NFD break Hangul syllables or
compatibility jamo such as ㅋㅋ), without control characters.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zstandard

from hanlm.config import DEFAULT_SOURCE
from hanlm.console import warn
from hanlm.files import damaged_files, file_record, read_json
from hanlm.results import Part, Result
from hanlm.streams import open_text_stream

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

    def write(self, doc_id: str, text: str) -> None:
        line = json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n"
        self.write_line(line.encode("utf-8"), len(text))

    def write_line(self, line: bytes, chars: int) -> None:
        """One JSONL record already encoded, whose text has `chars` characters."""
        if self._writer is None:
            self._open()
        self._writer.write(line)
        self._docs += 1
        self._chars += chars
        if self._chars >= self.part_chars:
            self._close()

    def close(self) -> list[dict]:
        self._close()
        return self.parts


class LongDocuments(Part):
    """Documents over corpus.max_document_chars, the pieces they were cut into, and the rule."""

    documents: int
    pieces: int
    max_chars: int
    action: str


class PiiReplaced(Part):
    """Personal data of one kind replaced in the documents kept (hanlm/data/pii.py)."""

    replaced: int
    replacement: str  # the string put in its place
    examples: list[str]  # the text around a few replacements, after them


class MetadataFiltered(Part):
    """Documents dropped by what their source says of them."""

    language_score: int  # under the source's min_language_score
    url_blocklist: int  # a `url` on corpus.url_blocklist's domains
    blocked_url_examples: list[str]


class SourceRead(Part):
    """How much of a source the corpus stage read, and why (hanlm.data.read_plan)."""

    asked: str | int  # its `read`: "needed", "all" or N training tokens
    needed_characters: int | None  # what its share needs read; None: read whole
    why: str
    tasks_read: int  # the tasks (row groups, byte ranges, files) drawn
    tasks: int  # of the tasks it has
    bytes_read: int
    bytes: int  # what it holds (its tasks' sizes)
    bytes_per_character: float | None  # measured on the first task drawn (None: read whole)
    whole: bool


class SourceCounts(Part):
    """One source's documents through the cleaning, and the sources whose documents its
    removed duplicates repeated (the cluster keeps its earliest document: sources in order)."""

    documents_in: int
    characters_in: int
    too_short: int
    quality_filtered: int  # by the quality filters and the metadata filters
    pii_replaced: int  # personal data replaced (every kind), not documents removed
    exact_duplicates: int
    near_duplicates: int
    documents_out: int
    characters_out: int
    duplicates_kept_by: dict[str, int]


class CorpusStats(Result):
    """`corpus/stats.json`: the counts of the cleaning and the parts written (path, documents,
    characters, size, sha256: what a reuse checks)."""

    FILE = STATS_FILE
    MADE_BY = "corpus"

    inputs: list[str]
    # the commit each local snapshot (hf:FOLDER...) was downloaded at; None: not recorded
    revisions: dict[str, str | None]
    documents_in: int
    characters_in: int
    documents_out: int
    characters_out: int
    too_short: int
    exact_duplicates: int
    near_duplicates: int | None  # None: no near-duplicate pass
    quality_filtered: dict[str, int] | None  # by failed check; None: quality filters off
    filtered: MetadataFiltered
    pii: dict[str, PiiReplaced]  # by kind: email, ipv4, ipv6, mobile, landline, resident_number
    long_documents: LongDocuments
    skipped: dict[str, int]  # records skipped, by reason
    damaged_files: list[dict[str, Any]]  # path, error, documents_kept
    parts: list[dict[str, Any]]  # path, source, documents, characters, size, sha256
    sources: dict[str, SourceCounts]  # by [[corpus.sources]] name ("corpus": flat inputs)
    reads: dict[str, SourceRead]  # how far each source was read, and why
    tasks: int
    job_seconds: dict[str, float]
    seconds: float


def warn_skipped(stats: CorpusStats) -> None:
    """Say which inputs were damaged and which records were skipped (without --strict)."""
    for damaged in stats.damaged_files:
        warn(
            f"corpus: {damaged['path']} is damaged ({damaged['error']}); skipped after "
            f"{damaged['documents_kept']:,} documents (use --strict to fail instead)"
        )
    records = {k: n for k, n in stats.skipped.items() if k != "corrupt_file"}
    if records:
        warn(f"corpus: skipped records {records} (use --strict to fail instead)")


# ---------------------------------------------------------------------------------------------
# Reading a corpus folder (tokenizer, shards and decontam use these)


def damaged_parts(corpus_dir: Path) -> list[str]:
    """What is wrong with the parts a finished corpus folder's stats.json lists (their sizes
    and sha256: see files.damaged_files), or an empty list."""
    try:
        parts = read_json(Path(corpus_dir) / STATS_FILE)["parts"]
        return damaged_files(corpus_dir, parts)
    except (OSError, ValueError, TypeError, KeyError):
        return ["stats.json cannot be read"]


def part_sources(corpus_dir: Path) -> dict[str, str]:
    """Part file name -> the corpus source its documents came from, as stats.json lists them
    (a part it does not name: the one source of a flat corpus)."""
    try:
        parts = read_json(Path(corpus_dir) / STATS_FILE)["parts"]
        listed = {p["path"]: p.get("source", DEFAULT_SOURCE) for p in parts}
    except (OSError, ValueError, TypeError, KeyError):
        listed = {}
    return {p.name: listed.get(p.name, DEFAULT_SOURCE) for p in corpus_parts(corpus_dir)}


def corpus_parts(corpus_dir: Path) -> list[Path]:
    return sorted(Path(corpus_dir).glob(PART_GLOB))


def iter_part(path: Path) -> Iterator[dict]:
    with open_text_stream(path) as stream:
        for line in stream:
            yield json.loads(line)


def iter_corpus(corpus_dir: Path) -> Iterator[dict]:
    for part in corpus_parts(corpus_dir):
        yield from iter_part(part)
