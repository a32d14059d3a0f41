"""Corpus inputs: .txt / .jsonl / .parquet files (optionally .gz or .zst), Hugging Face dataset
ids and the built-in demo world, read as documents; bad records are skipped and counted (or, with
--strict, a UserError naming the file and line)."""

from __future__ import annotations

import glob
import io
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hanlm.config import CorpusSection
from hanlm.errors import UserError
from hanlm.files import DamagedCompressedFile, open_text_stream, strip_compression_suffix

SUPPORTED = ".txt, .jsonl, .parquet (each optionally .gz or .zst), hf:NAME[:CONFIG]:SPLIT, demo"


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
    nbytes: int = 0  # raw input bytes it came from (progress and rates)


def _decode(raw: bytes, skips: Skips, where: str) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        skips.skip("invalid_utf8", where, str(e))
        return None


def _lines(path: Path, span: tuple[int, int] | None) -> Iterator[tuple[str, bytes]]:
    """(where, raw line) of a file, or of the lines that start inside the byte range `span` of an
    uncompressed one (each line belongs to exactly one range). Lines of a whole file are named by
    number, lines of a range by byte offset (the lines before it were not counted)."""
    if span is None:
        with open_text_stream(path) as stream:
            for line_no, raw in enumerate(stream, start=1):
                yield f"{path.name}:{line_no}", raw
        return
    start, end = span
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line that started before the range belongs to the one before
        offset = f.tell()
        while offset < end:
            raw = f.readline()
            if not raw:
                return
            yield f"{path.name}@{offset}", raw
            offset += len(raw)


def _read_jsonl(
    path: Path, text_field: str, skips: Skips, span: tuple[int, int] | None = None
) -> Iterator[Document]:
    for name, raw in _lines(path, span):
        where = f"{path.parent / name}"
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
        yield Document(str(doc_id) if doc_id is not None else name, text, len(raw))


def _read_txt(
    path: Path, doc_per_line: bool, skips: Skips, span: tuple[int, int] | None = None
) -> Iterator[Document]:
    """Documents of a .txt file: one per line, or one per block of lines between blank lines
    (a block document may span a byte-range boundary, so only whole files are read as blocks)."""
    if doc_per_line:
        for name, raw in _lines(path, span):
            line = _decode(raw, skips, str(path.parent / name))
            if line is not None and line.strip():
                yield Document(name, line, len(raw))
        return
    block: list[bytes] = []
    start = ""
    for name, raw in _lines(path, None):
        if raw.strip():
            if not block:
                start = name
            block.append(raw)
            continue
        if block:
            yield from _block_document(path, start, block, skips)
            block = []
    if block:
        yield from _block_document(path, start, block, skips)


def _block_document(path: Path, name: str, block: list[bytes], skips: Skips) -> Iterator[Document]:
    raw = b"".join(block)
    text = _decode(raw, skips, str(path.parent / name))
    if text is not None:
        yield Document(name, text, len(raw))


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
            yield Document(f"{path.name}:{row}", value, len(value) * 3)  # ~UTF-8 size


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
    source: str | Path,
    c: CorpusSection,
    skips: Skips,
    *,
    demo_file: Path | None = None,
    span: tuple[int, int] | None = None,
) -> Iterator[Document]:
    """The documents of one input (or of the byte range `span` of an uncompressed .jsonl or
    one-document-per-line .txt file); `demo` is read from `demo_file` (the demo world's
    pretraining text, which the caller has written)."""
    if source == "demo":
        yield from _read_jsonl(demo_file, "text", skips, span)
        return
    if isinstance(source, str):
        yield from _read_hf(source, c.text_field, skips)
        return
    kind = Path(strip_compression_suffix(source.name)).suffix.lower()
    try:
        if kind == ".txt":
            yield from _read_txt(source, c.doc_per_line, skips, span)
        elif kind == ".jsonl":
            yield from _read_jsonl(source, c.text_field, skips, span)
        else:
            yield from _read_parquet(source, c.text_field, skips)
    except DamagedCompressedFile as e:  # truncated or failing its checksum
        skips.damaged_file(str(source), e.detail)
    except OSError as e:  # unreadable part-way (an I/O error)
        skips.damaged_file(str(source), f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# Work units: the inputs cut into pieces of about `task_bytes`, one task of the data engine each


@dataclass(frozen=True)
class Unit:
    """A piece of the input: a whole file or Hugging Face stream, or a byte range of an
    uncompressed line-per-document file. Units depend only on the inputs and the task size, so
    the tasks (and the output) do not depend on how many workers run them."""

    source: str  # a file path, `demo` or an hf: id
    span: tuple[int, int] | None = None
    nbytes: int = 0  # input bytes it covers (on disk; compressed files count compressed)

    def documents(
        self, c: CorpusSection, skips: Skips, demo_file: Path | None = None
    ) -> Iterator[Document]:
        source: str | Path = self.source
        if source != "demo" and not source.startswith("hf:"):
            source = Path(source)
        return read_source(source, c, skips, demo_file=demo_file, span=self.span)


def _splittable(path: Path, c: CorpusSection) -> bool:
    if strip_compression_suffix(path.name) != path.name:
        return False  # a compressed stream cannot be entered in the middle
    kind = path.suffix.lower()
    return kind == ".jsonl" or (kind == ".txt" and c.doc_per_line)


def plan_units(
    sources: list[str | Path], c: CorpusSection, task_bytes: int, *, demo_file: Path | None = None
) -> list[Unit]:
    """The inputs in order, big uncompressed line files cut into byte ranges of `task_bytes`."""
    units: list[Unit] = []
    for source in sources:
        if isinstance(source, str) and source != "demo":
            units.append(Unit(source))
            continue
        path = demo_file if source == "demo" else source
        size = path.stat().st_size
        name = "demo" if source == "demo" else str(path)
        if size <= task_bytes or not (source == "demo" or _splittable(path, c)):
            units.append(Unit(name, None, size))
            continue
        pieces = -(-size // task_bytes)
        bounds = [size * i // pieces for i in range(pieces + 1)]
        units.extend(Unit(name, (a, b), b - a) for a, b in itertools.pairwise(bounds))
    return units


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
