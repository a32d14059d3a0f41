"""Corpus inputs: .txt / .jsonl / .parquet files (optionally .gz or .zst), Hugging Face dataset
ids and the built-in demo world, read as documents; bad records are skipped and counted (or, with
--strict, a UserError naming the file and line)."""

from __future__ import annotations

import dataclasses
import glob
import io
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hanlm.config import DEFAULT_SOURCE, CorpusSection, CorpusSourceSection, SourceFields
from hanlm.data.dataset_repo import (
    file_name,
    hf_download_fix,
    hf_offline,
    hub_name_and_revision,
    hub_split_files,
    is_hf_id,
    is_hub_file,
    open_hub_file,
    parse_hf,
    snapshot_files,
    snapshot_folder,
)
from hanlm.errors import UserError
from hanlm.streams import (
    DamagedCompressedFile,
    lines_in_range,
    open_text_stream,
    strip_compression_suffix,
)

SUPPORTED = (
    ".txt, .jsonl, .parquet (each optionally .gz or .zst), hf:NAME[@REVISION][:CONFIG]:SPLIT, "
    "demo, "
    "demo:wiki, demo:web"
)


def is_demo(spec) -> bool:
    """`demo` (the demo world's documents) or `demo:NAME` (those of one of its sources)."""
    return isinstance(spec, str) and (spec == "demo" or spec.startswith("demo:"))


def demo_kinds(spec: str) -> tuple[str, ...] | None:
    """The document kinds a demo input reads; None: all of them."""
    if spec == "demo":
        return None
    from hanlm.demo.world import DEMO_SOURCES  # deferred: the generators are not needed here

    name = spec.removeprefix("demo:")
    if name not in DEMO_SOURCES:
        raise UserError(
            f"corpus input {spec!r} names no source of the demo world",
            fix=f"use demo (all of it) or one of: {', '.join('demo:' + n for n in DEMO_SOURCES)}",
        )
    return DEMO_SOURCES[name]


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
    metadata: dict = field(default_factory=dict)  # the source's metadata fields it has


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
    for offset, raw in lines_in_range(path, *span):
        yield f"{path.name}@{offset}", raw


def _read_jsonl(
    path: Path, fields: SourceFields, skips: Skips, span: tuple[int, int] | None = None,
    kinds: tuple[str, ...] | None = None,
) -> Iterator[Document]:  # fmt: skip
    """kinds: only the records whose "kind" is one of them (the demo world's sources)."""
    text_field = fields.text
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
        if kinds is not None and record.get("kind") not in kinds:
            continue
        doc_id = record.get(fields.id)
        metadata = {k: record[k] for k in fields.metadata if k in record}
        yield Document(str(doc_id) if doc_id is not None else name, text, len(raw), metadata)


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


def _open_parquet(path: Path | str):
    """The parquet file at `path` (read into memory when compressed as a whole: parquet needs
    random access; a Hub file `hf://...` is read by range, its footer and the row groups
    asked for), or a UserError naming it."""
    import pyarrow.parquet as pq  # deferred: pyarrow is heavy and only parquet inputs need it

    if is_hub_file(path):
        source = open_hub_file(path)
    elif strip_compression_suffix(path.name) != path.name:
        with open_text_stream(path) as stream:
            source = io.BytesIO(stream.read())
    else:
        source = path
    try:
        return pq.ParquetFile(source)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a damaged file
        raise UserError(f"cannot read parquet file: {e}", where=str(path)) from None


FIELD_FIX = (
    "set the source's text_field in its [[corpus.sources]] table (or corpus.text_field, "
    "--text-field, for every source) to one of its fields"
)


def check_columns(names: list[str], fields: SourceFields, where: str) -> None:
    """A file or stream with columns `names` has the ones a source's records are read by: its
    text and the metadata its filters read (language_score, url, `metadata`)."""
    if fields.text not in names:
        raise UserError(
            f"no column {fields.text!r} to read the text from",
            where=where,
            fix=f"{FIELD_FIX}: {', '.join(names)}",
        )
    missing = [m for m in fields.metadata if m not in names]
    if missing:
        raise UserError(
            f"no column {', '.join(map(repr, missing))} (asked for as metadata: the source's "
            "metadata, or what its filters read)",
            where=where,
            fix=f"choose among its columns: {', '.join(names)}",
        )


def probe(source: Path | str, fields: SourceFields) -> None:
    """The file opens and its first record holds what the corpus stage reads by `fields`: a
    parquet footer with the columns, a JSONL record with a string text field. Reads no more."""
    kind = Path(strip_compression_suffix(file_name(source))).suffix.lower()
    if kind == ".parquet":
        pf = _open_parquet(Path(source) if not is_hub_file(source) else source)
        check_columns(pf.schema_arrow.names, fields, str(source))
        return
    try:
        with open_text_stream(source) as stream:
            first = next((line for line in stream if line.strip()), None)
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise UserError(f"cannot be read ({type(e).__name__}: {e})", where=str(source)) from None
    if kind != ".jsonl" or first is None:
        return
    try:
        record = json.loads(first)
    except ValueError as e:
        raise UserError(f"its first line is not JSON ({e})", where=str(source)) from None
    if not isinstance(record, dict) or not isinstance(record.get(fields.text), str):
        names = list(record) if isinstance(record, dict) else []
        raise UserError(
            f"its first record has no string field {fields.text!r} to read the text from",
            where=str(source),
            fix=f"{FIELD_FIX}: {', '.join(names) or 'it is not a JSON object'}",
        )


def parquet_row_groups(path: Path | str, fields: SourceFields) -> list[tuple[int, int]]:
    """(rows, uncompressed bytes of the text column) of each row group, from the file's footer
    alone: what a task of some row groups will read, before anything is read."""
    pf = _open_parquet(path)
    check_columns(pf.schema_arrow.names, fields, str(path))
    text_field = fields.text
    meta = pf.metadata
    groups = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        text_bytes = sum(
            group.column(j).total_uncompressed_size
            for j in range(group.num_columns)
            if group.column(j).path_in_schema == text_field
        )
        groups.append((group.num_rows, text_bytes or group.total_byte_size))
    return groups


def _read_parquet(
    path: Path | str, fields: SourceFields, skips: Skips, row_groups: tuple[int, int] | None = None
) -> Iterator[Document]:
    """The documents of a parquet file, or of its row groups [first, end) (rows keep their
    number in the whole file, so a document without an id column has the same id however the
    file was split)."""
    text_field = fields.text
    pf = _open_parquet(path)
    names = pf.schema_arrow.names
    check_columns(names, fields, str(path))
    extra = [c for c in (fields.id, *fields.metadata) if c in names and c != text_field]
    extra = list(dict.fromkeys(extra))
    groups = range(pf.metadata.num_row_groups) if row_groups is None else range(*row_groups)
    row = sum(pf.metadata.row_group(i).num_rows for i in range(groups.start))
    if not groups:
        return
    columns = [text_field, *extra]
    for batch in pf.iter_batches(columns=columns, batch_size=4096, row_groups=groups):
        values = {name: batch.column(i).to_pylist() for i, name in enumerate(columns)}
        for j, value in enumerate(values[text_field]):
            row += 1
            where = f"{path}:row {row}"
            if isinstance(value, bytes):
                value = _decode(value, skips, where)
                if value is None:
                    continue
            if not isinstance(value, str):
                skips.skip("missing_field", where, f"{text_field!r} is empty or not text")
                continue
            own_id = values[fields.id][j] if fields.id in values else None
            metadata = {m: values[m][j] for m in fields.metadata}
            doc_id = str(own_id) if own_id is not None else f"{file_name(path)}:{row}"
            yield Document(doc_id, value, len(value) * 3, metadata)  # ~UTF-8 size


def _open_hf_stream(spec: str):
    """The dataset `spec` names as a streaming IterableDataset, or a UserError saying how to
    download it when it cannot be streamed (offline, no network, no access, no such dataset)."""
    name, config, split = parse_hf(spec)
    try:
        import datasets  # deferred: optional (hanlm[hf]) and heavy
    except ImportError:
        raise UserError(
            f"reading {spec} needs the `datasets` package", fix="pip install 'hanlm[hf]'"
        ) from None
    if hf_offline():
        raise UserError(
            f"{spec} cannot be streamed: Hugging Face is set offline (HF_HUB_OFFLINE or "
            "HF_DATASETS_OFFLINE)",
            fix=hf_download_fix(spec),
        )
    try:
        repo, revision = hub_name_and_revision(name)
        pinned = {"revision": revision} if revision else {}
        return datasets.load_dataset(repo, config, split=split, streaming=True, **pinned)
    except Exception as e:  # network, authentication or a missing dataset: all need the user
        raise _stream_error(spec, e) from None


def _stream_error(spec: str, e: Exception) -> UserError:
    return UserError(
        f"could not stream {spec}: {type(e).__name__}: {e}",
        fix=f"check the name, config and split on huggingface.co, the network, and `hf auth "
        f"login` for a gated dataset; or {hf_download_fix(spec)}",
    )


def _num_shards(dataset) -> int:
    count = getattr(dataset, "num_shards", None)  # datasets >= 2.16; n_shards before
    return int(count if count is not None else getattr(dataset, "n_shards", 1))


def hf_num_shards(spec: str) -> int:
    """How many data files (shards) the stream of `spec` has: the most tasks that can read it
    without two reading the same file. Needs the network (it resolves the file list)."""
    return _num_shards(_open_hf_stream(spec))


def _share(dataset, shard: tuple[int, int]):
    """Share `index` of `count` disjoint shares that together hold every record once. With no
    more shares than data files, each share is a contiguous run of whole files (each file read
    by one task); with more, every task reads the whole stream and keeps every count-th record
    (datasets' split_dataset_by_node), so plan tasks with hf_num_shards."""
    index, count = shard
    if count < 1 or not 0 <= index < count:
        raise UserError(
            f"bad share {index} of {count} of a Hugging Face stream",
            fix="give shard=(index, count) with count >= 1 and 0 <= index < count",
        )
    if count == 1:
        return dataset
    if count <= _num_shards(dataset):
        return dataset.shard(num_shards=count, index=index, contiguous=True)
    from datasets.distributed import split_dataset_by_node  # deferred: optional (hanlm[hf])

    return split_dataset_by_node(dataset, rank=index, world_size=count)


def _read_hf(
    spec: str, fields: SourceFields, skips: Skips, *, shard: tuple[int, int] | None = None
) -> Iterator[Document]:
    """The documents of a streamed Hugging Face dataset, or of share `shard` = (index, count)
    of it (see `_share`); records without a string `text_field` are skipped and counted."""
    name, _, split = parse_hf(spec)
    text_field = fields.text
    dataset = _open_hf_stream(spec)
    features = getattr(dataset, "features", None)
    if isinstance(features, dict) and features:
        check_columns(list(features), fields, spec)
    prefix = f"{name}:{split}"
    if shard is not None:
        dataset = _share(dataset, shard)
        prefix += f":{shard[0]}-of-{shard[1]}"  # row numbers count within the share
    try:
        for row, record in enumerate(dataset, start=1):
            text = record.get(text_field)
            if not isinstance(text, str):
                skips.skip("missing_field", f"{spec}:row {row}", f"no string field {text_field!r}")
                continue
            own_id = record.get(fields.id)
            metadata = {k: record[k] for k in fields.metadata if k in record}
            doc_id = str(own_id) if own_id is not None else f"{prefix}:{row}"
            yield Document(doc_id, text, metadata=metadata)
    except UserError:
        raise
    except Exception as e:  # the connection dropped part-way, or a file could not be read
        raise _stream_error(spec, e) from None


def expand_inputs(inputs: list[str]) -> list[str | Path]:
    """Globs become sorted file lists; an `hf:` id naming a local snapshot folder its split's
    data files; a Hub id whose split is parquet files (online) those files at the commit it
    resolves to (`hf://datasets/REPO@SHA/PATH`, read by row group); other `hf:` ids (offline,
    or JSON files on the Hub: streamed) and `demo` pass through. No match is an error."""
    if not inputs:
        raise UserError("no corpus inputs given", fix=f"pass --input with one of: {SUPPORTED}")
    expanded: list[str | Path] = []
    for spec in inputs:
        if is_hf_id(spec) and snapshot_folder(spec) is not None:
            expanded.extend(snapshot_files(spec))  # read as the local files they are
            continue
        if is_hf_id(spec) and not hf_offline():
            files = hub_split_files(spec)
            if all(_is_plain_parquet(Path(file_name(f))) for f in files):
                expanded.extend(files)
                continue
        if is_demo(spec) or is_hf_id(spec):
            if is_demo(spec):
                demo_kinds(spec)  # refuses a demo source that does not exist
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
    corpus: CorpusSection,
    skips: Skips,
    *,
    demo_file: Path | None = None,
    span: tuple[int, int] | None = None,
    fields: SourceFields | None = None,
) -> Iterator[Document]:
    """The documents of one input, or of its piece `span`: a byte range of an uncompressed
    .jsonl or one-document-per-line .txt file, row groups [first, end) of a parquet file, or a
    share of a stream; `demo` is read from `demo_file` (the demo world's pretraining text,
    which the caller has written)."""
    fields = fields or SourceFields(corpus.text_field)
    if is_demo(source):
        yield from _read_jsonl(demo_file, SourceFields(), skips, span, demo_kinds(source))
        return
    if is_hf_id(source):  # span: (share, shares) of the stream's files
        yield from _read_hf(source, fields, skips, shard=span)
        return
    kind = Path(strip_compression_suffix(file_name(source))).suffix.lower()
    try:
        if kind == ".txt":
            yield from _read_txt(source, corpus.doc_per_line, skips, span)
        elif kind == ".jsonl":
            yield from _read_jsonl(source, fields, skips, span)
        else:
            yield from _read_parquet(source, fields, skips, span)
    except DamagedCompressedFile as e:  # truncated or failing its checksum
        skips.damaged_file(str(source), e.detail)
    except OSError as e:  # unreadable part-way (an I/O error)
        skips.damaged_file(str(source), f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# Work units: the inputs cut into pieces of about `task_bytes`, one task of the data engine each


@dataclass(frozen=True)
class Unit:
    """A piece of the input: a whole file, a byte range of an uncompressed line-per-document
    file, row groups of a parquet file, or a share of a Hugging Face stream's data files. Units
    depend only on the inputs and the task size, so the tasks (and the output) do not depend on
    how many workers run them."""

    source: str  # a file path, a Hub file (hf://...), `demo` or an hf: id (a stream)
    # bytes (start, end) of a line file; row groups [first, end) of a parquet file; (share,
    # shares) of an hf: stream
    span: tuple[int, int] | None = None
    # input bytes it covers: on disk (compressed files count compressed), or for parquet the
    # text column's uncompressed bytes in the footer
    nbytes: int = 0
    corpus_source: str = DEFAULT_SOURCE  # the [[corpus.sources]] entry it belongs to

    def documents(
        self, corpus: CorpusSection, skips: Skips, demo_file: Path | None = None
    ) -> Iterator[Document]:
        source: str | Path = self.source
        if not is_demo(source) and not is_hf_id(source) and not is_hub_file(source):
            source = Path(source)
        spec = {s.name: s for s in corpus.source_list()}.get(self.corpus_source)
        fields = corpus.fields_of(spec) if spec is not None else None
        return read_source(
            source, corpus, skips, demo_file=demo_file, span=self.span, fields=fields
        )


def _splittable(path: Path, corpus: CorpusSection) -> bool:
    if strip_compression_suffix(path.name) != path.name:
        return False  # a compressed stream cannot be entered in the middle
    kind = path.suffix.lower()
    return kind == ".jsonl" or (kind == ".txt" and corpus.doc_per_line)


def _is_plain_parquet(path: Path) -> bool:
    """An uncompressed parquet file (a compressed one has no footer to read in place)."""
    return path.suffix.lower() == ".parquet"


def _row_group_units(path: Path | str, fields: SourceFields, task_bytes: int) -> list[Unit]:
    """Consecutive row groups of a parquet file, about `task_bytes` of text each (a row group
    larger than that is a task of its own): a task that fails reads its row groups again, not
    the file."""
    units: list[Unit] = []
    first, size = 0, 0
    groups = parquet_row_groups(path, fields)
    for i, (_, nbytes) in enumerate(groups):
        if size and size + nbytes > task_bytes:
            units.append(Unit(str(path), (first, i), size))
            first, size = i, 0
        size += nbytes
    if groups:
        units.append(Unit(str(path), (first, len(groups)), size))
    return units


def split_into_units(
    sources: list[str | Path],
    corpus: CorpusSection,
    task_bytes: int,
    *,
    demo_file: Path | None = None,
    fields: SourceFields | None = None,
) -> list[Unit]:
    """The inputs in order, big uncompressed line files cut into byte ranges of `task_bytes`
    and parquet files (local or on the Hub) into runs of row groups of about `task_bytes` of
    text; `fields`: the source's own (corpus.fields_of; default corpus.text_field's)."""
    fields = fields or SourceFields(corpus.text_field)
    units: list[Unit] = []
    for source in sources:
        if is_hub_file(source):
            units.extend(_row_group_units(source, fields, task_bytes))
            continue
        if is_hf_id(source):  # a task per data file of the stream; its size is not known
            shares = hf_num_shards(source)
            units.extend(Unit(source, (i, shares) if shares > 1 else None) for i in range(shares))
            continue
        path = demo_file if is_demo(source) else source
        if not is_demo(source) and _is_plain_parquet(path):
            units.extend(_row_group_units(path, fields, task_bytes))
            continue
        size = path.stat().st_size
        name = source if is_demo(source) else str(path)
        if size <= task_bytes or not (is_demo(source) or _splittable(path, corpus)):
            units.append(Unit(name, None, size))
            continue
        pieces = -(-size // task_bytes)
        bounds = [size * i // pieces for i in range(pieces + 1)]
        units.extend(Unit(name, (a, b), b - a) for a, b in itertools.pairwise(bounds))
    return units


def source_units(
    sources: list[CorpusSourceSection],
    corpus: CorpusSection,
    task_bytes: int,
    *,
    demo_file: Path | None = None,
) -> list[Unit]:
    """The units of every source, source after source in the recipe's order (deduplication
    keeps each cluster's earliest document: a document in two sources stays in the first)."""
    units: list[Unit] = []
    owner: dict[str, str] = {}
    for spec in sources:
        inputs = expand_inputs(spec.inputs)
        for item in inputs:
            key = str(item.resolve()) if isinstance(item, Path) else item
            if owner.setdefault(key, spec.name) != spec.name:
                raise UserError(
                    f"input {item} is in two corpus sources, {owner[key]!r} and {spec.name!r}: "
                    f"deduplication would leave all of it to {owner[key]!r}",
                    fix="list each input file in one source only",
                )
        units.extend(
            dataclasses.replace(unit, corpus_source=spec.name)
            for unit in split_into_units(
                inputs,
                corpus,
                task_bytes,
                demo_file=demo_file,
                fields=corpus.fields_of(spec),
            )
        )
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
