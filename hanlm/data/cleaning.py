"""The corpus stage as datatrove pipelines: raw inputs in, clean deduplicated parts out.

    clean    (one task per input unit)  read -> normalise -> length and quality filters
                                         -> signatures (dedup step 1) -> cleaned documents
    pairs    (one task per LSH band + 1) duplicate pairs (dedup step 2)
    clusters (one task)                  which documents go (dedup step 3)
    write    (one task per input unit)  drop them (dedup step 4) -> compressed parts

Tasks come from the inputs (hanlm.data.readers.split_into_units), so 1, 2 or 64 workers write
the same documents in the same order; the parts are numbered in input order at the end. Each task
writes only its own files; every count the stage reports is a step's `stat_update`, read back
from the stats file datatrove writes for each task (engine.task_counts).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import zstandard
from datatrove.data import Document as EngineDocument
from datatrove.pipeline.base import PipelineStep

from hanlm.config import CorpusSection, DataEngineSection
from hanlm.console import info, warn
from hanlm.data import dedup, engine, read_plan
from hanlm.data.corpus import PartWriter, normalise
from hanlm.data.dataset_repo import input_revisions
from hanlm.data.pii import EXAMPLES_PER_KIND, REPLACEMENTS, PiiScrubber
from hanlm.data.quality import QualityFilter
from hanlm.data.readers import Skips, Unit, source_units
from hanlm.errors import UserError

CLEAN, PAIRS, CLUSTERS, WRITE = "clean", "pairs", "clusters", "write"
DAMAGED = "damaged"  # per clean task: the input files it could not read to the end
QUALITY_PREFIX, SKIPPED_PREFIX = "quality:", "skipped:"  # count labels: removed, skipped records
PII_PREFIX, PII = "pii:", "pii"  # count labels and folder: personal data replaced, by kind
FILTERED_PREFIX = "filtered:"  # count labels: documents dropped by a metadata filter
URL_EXAMPLES = "url_blocklist"  # the key of the blocked URLs' examples in the pii/ files
LONG_DOCUMENTS, LONG_PIECES = "long_documents", "long_pieces"  # counts of the clean tasks
PAIRS_TASK_BYTES = 8 << 30  # input whose band records one pairs task reads (~100 MB of them)
PAIRS_GROUP_BYTES = 1 << 30  # a small corpus's bands go several to a task, up to this much input
SIGNATURE_BATCH_CHARS = 1 << 21  # documents hashed together (vectorised): ~2M characters


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False))
    os.replace(tmp, path)


def _damaged_path(work: Path, rank: int) -> Path:
    return Path(work) / DAMAGED / f"{rank:05d}.json"


def _pii_path(work: Path, rank: int) -> Path:
    return Path(work) / PII / f"{rank:05d}.json"


def _parts_path(work: Path, rank: int) -> Path:
    return Path(work) / WRITE / f"{rank:05d}" / "parts.json"


class ReadUnit(PipelineStep):
    """Each task reads its unit of the input; bad records are skipped and counted (--strict:
    the UserError naming the record stops the stage), and the files it could not read to the
    end are listed in damaged/NNNNN.json."""

    name = "📖 read"
    type = "📖 - READER"

    def __init__(
        self, units: list[Unit], corpus: CorpusSection, work: Path, demo_file: Path | None
    ):
        super().__init__()
        self.units, self.corpus, self.work, self.demo_file = units, corpus, str(work), demo_file

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> Iterator[EngineDocument]:
        unit = self.units[rank]
        skips = Skips(strict=self.corpus.strict)
        counter = engine.TaskCounter(self.work, CLEAN, rank)
        documents = 0
        for doc in unit.documents(self.corpus, skips, self.demo_file):
            documents += 1
            counter.add(1, doc.nbytes)
            self.stat_update("documents")
            yield EngineDocument(text=doc.text, id=doc.id, metadata=doc.metadata)
        counter.flush()
        for reason, count in skips.counts.items():
            self.stat_update(SKIPPED_PREFIX + reason, value=count)
        for damaged in skips.damaged:
            damaged["documents_kept"] = documents
        _write_json(_damaged_path(Path(self.work), rank), skips.damaged)


def cut_document(text: str, max_chars: int) -> Iterator[str]:
    """`text` in pieces of at most `max_chars` characters, one at a time, each ending where the
    last paragraph break, else line break, else space of its second half is (a piece of a text
    without any there ends at the limit); the whitespace at a cut starts the next piece (the
    cleaning strips it)."""
    start = 0
    while len(text) - start > max_chars:
        lo, hi = start + max_chars // 2, start + max_chars
        cut = -1
        for mark in ("\n\n", "\n", " "):
            at = text.rfind(mark, lo, hi)
            if at > start:
                cut = at
                break
        if cut < 0:
            cut = hi
        yield text[start:cut]
        start = cut
    yield text[start:]


class CleanDocuments(PipelineStep):
    """NFC normalisation and the length and quality filters, each removal counted by reason.

    A document longer than `corpus.max_document_chars` is cut into pieces of at most that many
    characters (cut_document), each one cleaned and kept or removed as a document of its own
    (id `ID#1`, `ID#2`, ...), or with `long_documents = "drop"` removed (with --strict: a
    UserError). This bounds the memory of the filters, the signatures and every later stage,
    which all hold a document whole."""

    name = "🧹 clean"
    type = "✂️ - FORMAT"

    def __init__(self, corpus: CorpusSection, units: list[Unit], work: Path):
        super().__init__()
        self.work = str(work)
        specs = {spec.name: spec for spec in corpus.source_list()}

        def rules(spec) -> tuple:  # a source's own settings, else the corpus's
            return (
                corpus.min_chars if spec.min_chars is None else spec.min_chars,
                corpus.quality.enabled if spec.quality is None else spec.quality,
                corpus.pii if spec.pii is None else spec.pii,
                spec.min_language_score,
                spec.metadata,
            )

        self.task_rules = [rules(specs[unit.corpus_source]) for unit in units]
        self.blocked = read_url_blocklist(corpus.url_blocklist) if corpus.url_blocklist else None
        self.quality_section = corpus.quality
        self.max_chars, self.long_action = corpus.max_document_chars, corpus.long_documents
        self.strict = corpus.strict

    def run(self, data, rank: int = 0, world_size: int = 1) -> Iterator[EngineDocument]:
        self.counts = counts = Counter()
        self.min_chars, quality_on, pii_on, self.min_score, self.kept = self.task_rules[rank]
        self.url_examples: list[str] = []
        quality = QualityFilter(self.quality_section) if quality_on else None
        self.pii = PiiScrubber() if pii_on else None
        for doc in data:
            counts["documents_in"] += 1
            counts["characters_in"] += len(doc.text)
            if not self.max_chars or len(doc.text) <= self.max_chars:
                yield from self._clean(doc, quality)
                continue
            counts[LONG_DOCUMENTS] += 1
            if self.long_action == "drop":
                self._refuse(doc)
                continue
            text, doc.text = doc.text, ""
            for k, piece in enumerate(cut_document(text, self.max_chars), start=1):
                counts[LONG_PIECES] += 1
                piece_doc = EngineDocument(text=piece, id=f"{doc.id}#{k}", metadata=doc.metadata)
                yield from self._clean(piece_doc, quality)
            del text
        if self.pii is not None:
            counts.update({PII_PREFIX + kind: n for kind, n in self.pii.seen.counts.items()})
        examples = dict(self.pii.seen.examples) if self.pii else {}
        examples[URL_EXAMPLES] = self.url_examples
        _write_json(_pii_path(self.work, rank), examples)
        for label, count in counts.items():  # once per task: a label per document costs time
            self.stat_update(label, value=count)

    def _clean(
        self, doc: EngineDocument, quality: QualityFilter | None
    ) -> Iterator[EngineDocument]:
        counts = self.counts
        if self._filtered_by_metadata(doc):
            return
        doc.metadata = {k: v for k, v in doc.metadata.items() if k in self.kept}
        text = normalise(doc.text)
        if len(text) < self.min_chars:
            counts["too_short"] += 1
            return
        if quality is not None and (reason := quality.reason(text)) is not None:
            counts[QUALITY_PREFIX + reason] += 1
            return
        doc.text = text if self.pii is None else self.pii.scrub(text)
        yield doc

    def _filtered_by_metadata(self, doc: EngineDocument) -> bool:
        """A language score under the source's minimum, or a URL on the blocklist: counted."""
        score = doc.metadata.get("language_score")
        if (
            self.min_score is not None
            and isinstance(score, (int, float))
            and score < self.min_score
        ):
            self.counts[FILTERED_PREFIX + "language_score"] += 1
            return True
        url = doc.metadata.get("url")
        if self.blocked is not None and isinstance(url, str) and blocked_domain(url, self.blocked):
            self.counts[FILTERED_PREFIX + "url_blocklist"] += 1
            if len(self.url_examples) < 3:
                self.url_examples.append(url[:200])
            return True
        return False

    def _refuse(self, doc: EngineDocument) -> None:
        if self.strict:
            raise UserError(
                f"document {doc.id!r} has {len(doc.text):,} characters, more than "
                f"corpus.max_document_chars ({self.max_chars:,}): the stage's memory grows "
                "with the longest document",
                fix="cut it into documents, raise corpus.max_document_chars (0: no limit), or "
                'set corpus.long_documents = "split" to cut it at paragraph, line or word '
                "boundaries; without --strict it is dropped and counted",
            )


class Signatures(PipelineStep):
    """Dedup step 1: content hashes and MinHash signatures of the documents that remain,
    computed in batches (vectorised) and written when the task ends."""

    name = "🎯 signatures"
    type = "🫂 - DEDUP"

    def __init__(self, root: Path, settings: dedup.DedupSettings):
        super().__init__()
        self.root, self.settings = str(root), settings

    def run(self, data, rank: int = 0, world_size: int = 1) -> Iterator[EngineDocument]:
        writer = dedup.SignatureWriter(Path(self.root), rank, self.settings)
        batch: list[EngineDocument] = []
        chars = 0
        for doc in data:
            batch.append(doc)
            chars += len(doc.text)
            if chars >= SIGNATURE_BATCH_CHARS:
                writer.add([d.text for d in batch])
                yield from batch
                batch, chars = [], 0
        writer.add([d.text for d in batch])
        yield from batch
        writer.close()


class WriteCleaned(PipelineStep):
    """The task's cleaned documents, in order, for the write job to filter."""

    name = "💾 cleaned"
    type = "💽 - WRITER"

    def __init__(self, work: Path):
        super().__init__()
        self.work = str(work)

    def run(self, data, rank: int = 0, world_size: int = 1):
        path = Path(self.work) / CLEAN / f"{rank:05d}.jsonl.zst"
        path.parent.mkdir(parents=True, exist_ok=True)
        lengths: list[int] = []
        with open(path, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as out:
            for doc in data:
                out.write(_json_line(doc.id, doc.text, doc.metadata))
                lengths.append(len(doc.text))
        np.asarray(lengths, dtype=np.uint32).tofile(path.with_suffix("").with_suffix(".chars"))
        return iter(())


def _json_line(doc_id: str, text: str, metadata: dict | None = None) -> bytes:
    record = {"id": doc_id, "text": text, **({"metadata": metadata} if metadata else {})}
    return (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def read_url_blocklist(path: str) -> frozenset[str]:
    """The domains of a blocklist file: one a line, lower-cased, `#` starts a comment."""
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UserError(
            f"cannot read corpus.url_blocklist {path}: {e.strerror or e}",
            fix="give a text file of domains, one a line",
        ) from None
    return frozenset(
        d for line in lines if (d := line.split("#", 1)[0].strip().lower().lstrip("."))
    )


def blocked_domain(url: str, blocked: frozenset[str]) -> bool:
    """Whether the URL's host is a blocked domain or a subdomain of one."""
    host = urlsplit(url if "//" in url else "//" + url).hostname or ""
    parts = host.lower().rstrip(".").split(".")
    return any(".".join(parts[i:]) in blocked for i in range(len(parts)))


class WriteParts(PipelineStep):
    """Dedup step 4: the task's cleaned documents less its removal list, as compressed parts
    listed in parts.json."""

    name = "📦 parts"
    type = "💽 - WRITER"

    def __init__(self, work: Path, part_chars: int):
        super().__init__()
        self.work, self.part_chars = str(work), part_chars

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        work = Path(self.work)
        cleaned = work / CLEAN / f"{rank:05d}.jsonl.zst"
        lengths = np.fromfile(cleaned.with_suffix("").with_suffix(".chars"), dtype=np.uint32)
        removals = dedup.read_removals(work / CLUSTERS, rank)
        out = work / WRITE / f"{rank:05d}"
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("part-*"):  # a rerun of a killed task starts clean
            old.unlink()
        counts: Counter = Counter()
        counter = engine.TaskCounter(work, WRITE, rank)
        writer = PartWriter(out, self.part_chars)
        with open(cleaned, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as raw:
            for index, line in enumerate(io.BufferedReader(raw, 1 << 20)):
                counter.add(1, len(line))
                reason = removals.get(index)
                if reason == dedup.REASON_EXACT:
                    counts["exact_duplicates"] += 1
                elif reason == dedup.REASON_NEAR:
                    counts["near_duplicates"] += 1
                else:
                    writer.write_line(line, int(lengths[index]))
                    counts["documents_out"] += 1
                    counts["characters_out"] += int(lengths[index])
        counter.flush()
        _write_json(_parts_path(work, rank), writer.close())
        for label, count in counts.items():
            self.stat_update(label, value=count)


# ---------------------------------------------------------------------------------------------
# The stage's jobs, and the parts gathered when they are done


def jobs(
    units: list[Unit], corpus: CorpusSection, seed: int, work: Path, demo_file: Path | None
) -> list[engine.Job]:
    settings = dedup.DedupSettings(
        near=corpus.near_dedup, num_perm=corpus.near_dedup_num_perm, ngram=corpus.near_dedup_ngram,
        seed=seed, threshold=corpus.near_dedup_threshold,
    )  # fmt: skip
    # each pairs task reads the band records of about PAIRS_TASK_BYTES of input: a big corpus's
    # bands in pieces; a small corpus's bands several to a task (a task costs ~30 ms of setup),
    # up to PAIRS_GROUP_BYTES of input in all, so that a few hundred MB still spread over workers
    input_bytes = sum(u.nbytes for u in units)
    ranges = max(1, math.ceil(input_bytes / PAIRS_TASK_BYTES))
    kinds_per_task = max(1, min(settings.kinds, PAIRS_GROUP_BYTES // max(input_bytes, 1)))
    pairs = dedup.FindDuplicatePairs(
        work / "signatures", work / PAIRS, settings, ranges, kinds_per_task
    )
    clean = [
        ReadUnit(units, corpus, work, demo_file),
        CleanDocuments(corpus, units, work),
        Signatures(work / "signatures", settings),
        WriteCleaned(work),
    ]
    return [
        engine.Job(CLEAN, clean, tasks=len(units)),
        engine.Job(PAIRS, [pairs], tasks=pairs.tasks),
        engine.Job(
            CLUSTERS,
            [dedup.ClusterDuplicates(work / "signatures", work / PAIRS, work / CLUSTERS, settings)],
            tasks=1,
        ),
        engine.Job(WRITE, [WriteParts(work, corpus.part_chars)], tasks=len(units)),
    ]


def build(
    corpus: CorpusSection,
    seed: int,
    engine_cfg: DataEngineSection,
    work: Path,
    out: Path,
    *,
    needs: dict[str, int | None] | None = None,
    demo_file: Path | None = None,
) -> dict | None:
    """Run the stage's jobs in `work` and gather the parts and counts into `out`; the stats
    (stats.json's content), or None when the jobs were submitted to a cluster and still run.
    `needs`: the characters each source is read for (hanlm.data.read_plan; None: all)."""
    started = time.perf_counter()
    sources = corpus.source_list()
    units = source_units(sources, corpus, engine_cfg.task_mb << 20, demo_file=demo_file)
    units, reads = read_plan.select(units, needs or {}, corpus, seed, demo_file=demo_file)
    for name, read in reads.items():
        if not read.whole:
            info(
                f"corpus: source {name!r}: reading {read.tasks_read:,} of {read.tasks:,} tasks "
                f"({read.bytes_read / 1e9:,.2f} of {read.bytes / 1e9:,.2f} GB): {read.why}"
            )
    total = sum(u.nbytes for u in units)
    progress = engine.Progress(work, "corpus", {CLEAN: total})
    stage_jobs = jobs(units, corpus, seed, work, demo_file)
    if not engine.run_jobs(stage_jobs, engine_cfg, work, progress=progress):
        return None
    quality = any(corpus.quality.enabled if s.quality is None else s.quality for s in sources)
    stats = gather(
        work,
        units,
        out,
        near=corpus.near_dedup,
        quality=quality,
        source_names=[s.name for s in sources],
    )
    long = stats["long_documents"]
    long.update(max_chars=corpus.max_document_chars, action=corpus.long_documents)
    if long["documents"] and corpus.long_documents == "split":
        info(
            f"corpus: {long['documents']:,} documents longer than corpus.max_document_chars "
            f"({corpus.max_document_chars:,} characters) were cut into {long['pieces']:,} documents"
        )
    elif long["documents"]:
        warn(
            f"corpus: {long['documents']:,} documents longer than corpus.max_document_chars "
            f"({corpus.max_document_chars:,} characters) were dropped (corpus.long_documents = "
            '"split" cuts them instead; --strict fails on them)'
        )
    replaced = {kind: c["replaced"] for kind, c in stats["pii"].items() if c["replaced"]}
    if replaced:
        listed = ", ".join(f"{n:,} {kind.replace('_', ' ')}" for kind, n in replaced.items())
        info(f"corpus: personal data replaced (corpus.pii): {listed}")
    stats["reads"] = {name: read.model_dump() for name, read in reads.items()}
    stats["job_seconds"] = {job.name: round(job.seconds, 3) for job in stage_jobs}
    stats["inputs"] = corpus.all_inputs()
    stats["revisions"] = input_revisions(corpus.all_inputs())
    stats["seconds"] = round(time.perf_counter() - started, 3)
    return stats


SOURCE_COUNTS = (
    "documents_in", "characters_in", "too_short", "exact_duplicates", "near_duplicates",
    "documents_out", "characters_out",
)  # fmt: skip


@dataclass
class _Collected:
    """What every task of the cleaning counted and wrote, summed in input order."""

    counts: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # input records not read, by reason
    damaged: list[dict] = field(default_factory=list)
    parts: list[dict] = field(default_factory=list)
    pii_examples: dict[str, list[str]] = field(default_factory=dict)
    blocked_urls: list[str] = field(default_factory=list)
    by_source: dict[str, Counter] = field(default_factory=dict)


def _collect(work: Path, units: list[Unit], out: Path, source_names: list[str]) -> _Collected:
    """Every task's counts, examples and parts (moved into `out`, numbered in input order)."""
    got = _Collected(by_source={name: Counter() for name in source_names})
    counts, skipped, damaged, parts = got.counts, got.skipped, got.damaged, got.parts
    pii_examples, blocked_urls, by_source = got.pii_examples, got.blocked_urls, got.by_source
    for rank, unit in enumerate(units):
        task: Counter = Counter()
        for label, count in engine.task_counts(work, CLEAN, rank).items():
            if label.startswith(SKIPPED_PREFIX):
                skipped[label.removeprefix(SKIPPED_PREFIX)] += count
            else:
                task[label] += count
        damaged.extend(json.loads(_damaged_path(work, rank).read_text()))
        for kind, examples in json.loads(_pii_path(work, rank).read_text()).items():
            if kind == URL_EXAMPLES:
                blocked_urls += examples[: 3 - len(blocked_urls)]
                continue
            kept = pii_examples.setdefault(kind, [])
            kept += examples[: EXAMPLES_PER_KIND - len(kept)]
        for part in json.loads(_parts_path(work, rank).read_text()):
            name = f"part-{len(parts):05d}.jsonl.zst"
            shutil.move(work / WRITE / f"{rank:05d}" / part["path"], out / name)
            parts.append({**part, "path": name, "source": unit.corpus_source})
        task.update(engine.task_counts(work, WRITE, rank))
        counts.update(task)
        source = by_source[unit.corpus_source]
        source.update({k: task[k] for k in SOURCE_COUNTS})
        source["quality_filtered"] += sum(
            n for k, n in task.items() if k.startswith(QUALITY_PREFIX)
        )
        source["pii_replaced"] += sum(n for k, n in task.items() if k.startswith(PII_PREFIX))
        source["quality_filtered"] += sum(
            n for k, n in task.items() if k.startswith(FILTERED_PREFIX)
        )
    return got


def gather(
    work: Path, units: list[Unit], out: Path, *, near: bool, quality: bool,
    source_names: list[str],
) -> dict:  # fmt: skip
    """Move every task's parts into `out` numbered in input order; the counts of all tasks,
    and of each source."""
    got = _collect(work, units, out, source_names)
    counts, skipped, by_source = got.counts, got.skipped, got.by_source
    kept_by: dict[str, Counter] = {name: Counter() for name in source_names}
    for removed_in, kept_in, n in dedup.read_kept_by(work / CLUSTERS):
        kept_by[units[removed_in].corpus_source][units[kept_in].corpus_source] += n
    sources = {
        name: {**{k: int(c[k]) for k in (*SOURCE_COUNTS, "quality_filtered", "pii_replaced")},
               "duplicates_kept_by": dict(sorted(kept_by[name].items()))}
        for name, c in by_source.items()
    }  # fmt: skip
    stats = {
        "inputs": [],
        **{
            k: counts[k]
            for k in ("documents_in", "characters_in", "documents_out", "characters_out")
        },
        "too_short": counts["too_short"],
        "exact_duplicates": counts["exact_duplicates"],
        "near_duplicates": counts["near_duplicates"] if near else None,
        # documents the quality filters removed, by the check that failed (None: filters off)
        "quality_filtered": {
            k.removeprefix(QUALITY_PREFIX): counts[k]
            for k in sorted(counts)
            if k.startswith(QUALITY_PREFIX)
        }
        if quality
        else None,
        # documents dropped by a source's metadata: a language score under its minimum, a URL on
        # corpus.url_blocklist (with a few of the URLs)
        "filtered": {
            "language_score": counts[FILTERED_PREFIX + "language_score"],
            "url_blocklist": counts[FILTERED_PREFIX + "url_blocklist"],
            "blocked_url_examples": got.blocked_urls,
        },
        # personal data replaced in the documents kept, by kind: how many, the string put in
        # its place, and a few examples of the text around a replacement (after it)
        "pii": {
            kind: {
                "replaced": counts[PII_PREFIX + kind],
                "replacement": replacement,
                "examples": got.pii_examples.get(kind, []),
            }
            for kind, replacement in REPLACEMENTS.items()
        },
        # documents over corpus.max_document_chars, and the pieces they were cut into
        "long_documents": {"documents": counts[LONG_DOCUMENTS], "pieces": counts[LONG_PIECES]},
        "skipped": dict(sorted(skipped.items())),
        "damaged_files": got.damaged,
        "parts": got.parts,
        "sources": sources,
        "tasks": len(units),
    }
    if stats["documents_out"] == 0:
        _raise_empty(stats)
    empty = [name for name, c in sources.items() if c["documents_out"] == 0]
    if empty and len(sources) > 1:
        listed = ", ".join(f"{n} ({sources[n]['documents_in']:,} documents read)" for n in empty)
        raise UserError(
            f"corpus source(s) {listed} have no documents after cleaning and deduplication",
            fix="check the source's inputs, text_field and min_chars (a source whose documents "
            "all repeat an earlier source's is left empty by deduplication)",
        )
    return stats


def _raise_empty(stats: dict) -> None:
    records = sum(n for k, n in stats["skipped"].items() if k != "corrupt_file")
    what = (
        f"the corpus is empty after cleaning ({stats['documents_in']} documents read, "
        f"{stats['too_short']} too short, {records} records skipped"
    )
    fix = "check --input, --text-field and corpus.min_chars"
    long = stats["long_documents"]
    if long["documents"] and not long["pieces"]:
        what += f", {long['documents']} dropped as longer than corpus.max_document_chars"
        fix += ' (corpus.long_documents = "split" keeps long documents in pieces)'
    damaged = stats["damaged_files"]
    if damaged:
        named = "; ".join(f"{d['path']}: {d['error']}" for d in damaged[:3])
        more = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
        what += f", {len(damaged)} damaged input files ({named}{more})"
        fix = (
            "copy or download the damaged files again (`gzip -t` or `zstd -t` checks one), "
            "or leave them out; " + fix
        )
    raise UserError(what + ")", fix=fix)
