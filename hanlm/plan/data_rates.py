"""`hanlm plan`: the expected wall time of the data stages (corpus, decontam, shards).

Each stage's time is the corpus size over its measured rate (MB/s of UTF-8 text per core) times
the cores it runs on, each core after the first adding SCALING_EFFICIENCY of one. Every stage is
counted on the whole raw corpus: deduplication and decontamination shrink what the later stages
read, so the times are an upper bound for them.

The corpus size comes from, in order: `plan.corpus_gb`; the input files (plain files by their
size, parquet by its footer's uncompressed size of the text column, .gz/.zst files times
COMPRESSION_RATIO: an estimate; a Hub dataset's parquet files by their footers, read by range,
online); for what cannot be sized so (the demo world, a Hub id offline or of JSON files), the
token target (tokens x CHARS_PER_TOKEN x BYTES_PER_CHAR: the text that many tokens take).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from hanlm.config import SourceFields
from hanlm.data import dataset_repo
from hanlm.errors import UserError
from hanlm.streams import strip_compression_suffix

MB = 1e6
GB = 1e9


@dataclass(frozen=True)
class Rate:
    mb_per_s_per_core: float
    what: str  # the work the rate covers
    measured_by: str  # the command, machine and date behind the figure


# The one place to update when the benchmarks measure new figures. Machine: the project's
# reference machine (2 CPU cores, 24 GiB, no GPU, Python 3.11); see benchmarks/README.md.
DATA_RATES: dict[str, Rate] = {
    # `hanlm corpus` end to end, one worker (read, NFC, PII, exact dedup, MinHash near-dedup,
    # write; Python's start-up included), on the same 256 MB of FineWeb-2-shaped Korean rows
    # (487 characters a document on average) as JSONL and as parquet, median of 2 alternating
    # runs each: benchmarks/corpus_formats.py --mb 256 --files 4 --repeats 2, 2026-12-05
    "corpus_near_dedup": Rate(
        8.54,
        "read, normalise, exact and near-dedup (MinHash LSH)",
        "benchmarks/corpus_formats.py, JSONL, 2026-12-05",
    ),
    "corpus_near_dedup_parquet": Rate(
        9.52,
        "read, normalise, exact and near-dedup (MinHash LSH)",
        "benchmarks/corpus_formats.py, parquet, 2026-12-05",
    ),
    # the same with [corpus.quality] on
    "corpus_near_dedup_quality": Rate(
        5.39,
        "read, normalise, quality filters, exact and near-dedup",
        "benchmarks/corpus_formats.py, JSONL, 2026-12-05",
    ),
    "corpus_near_dedup_quality_parquet": Rate(
        6.08,
        "read, normalise, quality filters, exact and near-dedup",
        "benchmarks/corpus_formats.py, parquet, 2026-12-05",
    ),
    # the same without near_dedup (exact dedup only)
    "corpus": Rate(
        13.35,
        "read, normalise, exact dedup",
        "benchmarks/corpus_formats.py, JSONL, 2026-12-05",
    ),
    "corpus_parquet": Rate(
        15.85,
        "read, normalise, exact dedup",
        "benchmarks/corpus_formats.py, parquet, 2026-12-05",
    ),
    # `hanlm decontam` end to end, 1 worker (read, scan, reports): benchmarks/decontam.py --mb 50
    # on an idle machine, 44.5-49.0 MB/s, 2026-11-30
    "decontam": Rate(
        45.0,
        "scan for benchmark items, filter",
        "benchmarks/decontam.py, 2026-11-30",
    ),
    # `hanlm shards`, per worker: benchmarks/tokenize.py, 2.6-3.1 MB/s, 2026-11-30
    "shards": Rate(2.8, "tokenise, write token shards", "benchmarks/tokenize.py, 2026-11-30"),
}
PARQUET = "_parquet"  # a corpus rate's twin for parquet input (the same documents)
SCALING_EFFICIENCY = 0.9  # what each core after the first adds, of one core's rate
# 2 workers against 1 on the reference machine: corpus 1.85x (200 MB), shards 1.74-1.96x,
# decontam's scan 1.6x (50 MB; its index build stays in one process); at a field corpus's size
# the one-process parts (start-up, clustering) are a vanishing share.

# Korean web text: Hangul is 3 bytes in UTF-8, spaces, digits and Latin 1: ~2.5 bytes a character;
# a 32-64k byte-level BPE trained on Korean takes ~2.5 characters a token.
BYTES_PER_CHAR = 2.5
CHARS_PER_TOKEN = 2.5
COMPRESSION_RATIO = 3.5  # zstd or gzip JSONL of Korean text: 3-4x

STAGES = ("corpus", "decontam", "shards")


@dataclass(frozen=True)
class DataWork:
    """What the data stages will read, and on how many cores: part of a plan's Setup."""

    corpus_bytes: float
    size_basis: str  # how the size was found, in words
    size_estimated: bool  # not read from the files themselves
    cores: int
    cores_basis: str
    near_dedup: bool
    decontam: bool
    quality: bool = False  # [corpus.quality] enabled
    parquet_bytes: float = 0.0  # of corpus_bytes, what is read from parquet (its own rates)


def effective_cores(cores: int) -> float:
    return 1 + SCALING_EFFICIENCY * (cores - 1)


def data_time(work: DataWork) -> dict[str, Any]:
    """Each data stage's rate and wall time for `work`, and their sum."""
    eff = effective_cores(work.cores)
    mb = work.corpus_bytes / MB
    stages: dict[str, Any] = {}
    for stage in STAGES:
        if stage == "decontam" and not work.decontam:
            stages[stage] = {"skipped": "decontam.enabled = false"}
            continue
        key = stage
        if stage == "corpus" and work.near_dedup:
            key = "corpus_near_dedup_quality" if work.quality else "corpus_near_dedup"
        rate = DATA_RATES[key]
        per_core = rate.mb_per_s_per_core
        entry = {"rate": key, "what": rate.what, "measured_by": rate.measured_by}
        parquet_mb = min(work.parquet_bytes / MB, mb) if stage == "corpus" else 0.0
        if parquet_mb > 0:  # each format at its own rate: the blend is the seconds per MB
            parquet = DATA_RATES[key + PARQUET]
            seconds = (mb - parquet_mb) / per_core + parquet_mb / parquet.mb_per_s_per_core
            per_core = mb / seconds if seconds > 0 else parquet.mb_per_s_per_core
            entry.update(
                parquet_share=parquet_mb / mb,
                parquet_mb_per_s_per_core=parquet.mb_per_s_per_core,
                text_mb_per_s_per_core=rate.mb_per_s_per_core,
            )
        mb_per_s = per_core * eff
        stages[stage] = {
            **entry,
            "mb_per_s_per_core": per_core,
            "mb_per_s": mb_per_s,
            "hours": mb / mb_per_s / 3600,
        }
    return {
        "corpus_gb": work.corpus_bytes / GB,
        "size_basis": work.size_basis,
        "size_estimated": work.size_estimated,
        "cores": work.cores,
        "cores_basis": work.cores_basis,
        "scaling_efficiency": SCALING_EFFICIENCY,
        "effective_cores": eff,
        "stages": stages,
        "total_hours": sum(s.get("hours", 0.0) for s in stages.values()),
    }


# --- the corpus size ----------------------------------------------------------------------------


def file_text_bytes(path: Path, text_field: str) -> tuple[float, bool]:
    """Bytes of text a local input holds, and whether that is an estimate."""
    name = path.name
    if strip_compression_suffix(name) != name:
        return path.stat().st_size * COMPRESSION_RATIO, True
    if name.lower().endswith(".parquet"):
        try:
            import pyarrow.parquet as pq  # deferred: heavy

            meta = pq.ParquetFile(path).metadata
        except Exception:  # damaged or not parquet: the corpus stage reports it; size it roughly
            return path.stat().st_size * COMPRESSION_RATIO, True
        total = 0
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema == text_field:
                    total += column.total_uncompressed_size
        return float(total or path.stat().st_size), False
    return float(path.stat().st_size), False


def inputs_bytes(inputs: list[str], text_field: str) -> dict[str, Any]:
    """The text bytes of the files the inputs name now: local files and local snapshots, and
    (online) a Hub dataset's parquet files from their footers; what matched nothing; what
    cannot be sized before it is read (`remote`: the demo world, a stream, a Hub id offline)."""
    out: dict[str, Any] = {
        "bytes": 0.0,
        "parquet_bytes": 0.0,  # of bytes, in parquet files
        "files": 0,
        "hub_files": 0,
        "estimated": False,
        "missing": [],
        "remote": [],
    }
    for spec in inputs:
        if spec.startswith("hf:"):
            if dataset_repo.snapshot_folder(spec) is None:
                hub = _hub_parquet_bytes(spec, text_field)
                if hub is None:
                    out["remote"].append(spec)  # offline, or JSON files: not sized
                else:
                    out["bytes"] += hub[0]
                    out["parquet_bytes"] += hub[0]
                    out["hub_files"] += hub[1]
                continue
            try:
                files = dataset_repo.snapshot_files(spec)  # a local snapshot: its split's files
            except UserError:
                out["missing"].append(spec)
                continue
        elif spec == "demo" or spec.startswith("demo:"):
            out["remote"].append(spec)
            continue
        else:
            files = [Path(m) for m in glob.glob(os.path.expanduser(spec), recursive=True)]
            files = [f for f in files if f.is_file()]
        if not files:
            out["missing"].append(spec)
        for path in files:
            size, estimated = file_text_bytes(path, text_field)
            out["bytes"] += size
            out["parquet_bytes"] += size if path.name.lower().endswith(".parquet") else 0.0
            out["files"] += 1
            out["estimated"] |= estimated
    return out


def _hub_parquet_bytes(spec: str, text_field: str) -> tuple[float, int] | None:
    """(text bytes, files) of a Hub dataset's split from its parquet footers (read by range),
    or None when it cannot be told now (offline, unreachable, not parquet)."""
    from hanlm.data import readers  # deferred: pyarrow, for parquet footers

    if dataset_repo.hf_offline():
        return None
    try:
        files = dataset_repo.hub_split_files(spec)
        if not all(f.endswith(".parquet") for f in files):
            return None
        fields = SourceFields(text_field)
        total = sum(n for f in files for _, n in readers.parquet_row_groups(f, fields))
    except UserError:
        return None
    return float(total), len(files)


class Sized(NamedTuple):
    """The text bytes the corpus stage reads, how they were found, whether estimated, and how
    many of them it reads from parquet (each format has its own rate)."""

    bytes: float
    basis: str
    estimated: bool
    parquet_bytes: float = 0.0


def corpus_size(
    inputs: list[str],
    text_field: str,
    *,
    tokens: float | None,
    corpus_gb: float = 0.0,
    demo_mb: float | None = None,
) -> Sized | None:
    """What the inputs hold, or None when nothing tells the size. With `plan.corpus_gb` the
    parquet share is the inputs' own, where they can be sized."""
    local = inputs_bytes(inputs, text_field)
    share = local["parquet_bytes"] / local["bytes"] if local["bytes"] else 0.0
    if corpus_gb > 0:
        return Sized(corpus_gb * GB, "plan.corpus_gb", False, corpus_gb * GB * share)
    parts: list[str] = []
    if local["files"]:
        how = f"compressed x~{COMPRESSION_RATIO:g}" if local["estimated"] else "file sizes"
        parts.append(f"{local['files']:,} local files ({how})")
    if local["hub_files"]:
        parts.append(f"{local['hub_files']:,} Hub parquet files (their footers)")
    if local["files"] or local["hub_files"]:
        parts.append(f"{local['bytes'] / GB:,.1f} GB of text")
    if local["missing"]:
        parts.append(f"not there yet: {', '.join(local['missing'])}")
    size, estimated = local["bytes"], local["estimated"]
    if local["remote"]:
        if tokens:
            derived = tokens * CHARS_PER_TOKEN * BYTES_PER_CHAR
            parts.append(
                f"{', '.join(local['remote'])}: {'the rest of ' if local['files'] else ''}"
                f"{tokens / 1e9:,.3g}B tokens x "
                f"{CHARS_PER_TOKEN:g} chars/token x {BYTES_PER_CHAR:g} bytes/char = "
                f"{derived / GB:,.1f} GB"
            )
            if derived > size:
                size, estimated = derived, True
        elif demo_mb and all(r == "demo" or r.startswith("demo:") for r in local["remote"]):
            size += demo_mb * MB
            parts.append(f"demo world, {demo_mb:g} MB (demo.size_mb)")
        else:
            parts.append(f"{', '.join(local['remote'])}: not sized (no token target)")
    if size <= 0:
        return None
    return Sized(size, "; ".join(parts), estimated, min(local["parquet_bytes"], size))


def data_cores(plan_cores: int, engine) -> tuple[int, str]:
    """The cores the data stages run on: plan.data_cores, a local engine's workers, or this
    machine's."""
    if plan_cores > 0:
        return plan_cores, "plan.data_cores"
    if engine is not None and engine.executor == "local" and engine.workers > 0:
        return engine.workers, "data_engine.workers"
    cores = os.cpu_count() or 1
    if engine is not None and engine.executor != "local":
        return cores, f"this machine's; set plan.data_cores for the {engine.executor} cluster"
    return cores, "this machine's"


def data_work(cfg, tokens: float | None, plan_section=None) -> DataWork | None:
    """The data stages' work in the recipe `cfg`, or None when its size cannot be told: what
    the corpus stage will read (sources read "needed" as far as their shares need)."""
    corpus_cfg, plan_cfg = cfg.corpus, plan_section or cfg.plan
    sized = None if plan_cfg.corpus_gb > 0 else read_size(cfg)
    sized = sized or corpus_size(
        corpus_cfg.all_inputs(),
        corpus_cfg.text_field,
        tokens=tokens,
        corpus_gb=plan_cfg.corpus_gb,
        demo_mb=cfg.demo.size_mb,
    )
    if sized is None:
        return None
    cores, cores_basis = data_cores(plan_cfg.data_cores, cfg.data_engine)
    return DataWork(
        corpus_bytes=sized.bytes,
        size_basis=sized.basis,
        size_estimated=sized.estimated,
        parquet_bytes=sized.parquet_bytes,
        cores=cores,
        cores_basis=cores_basis,
        near_dedup=corpus_cfg.near_dedup,
        decontam=cfg.decontam.enabled,
        quality=corpus_cfg.quality.enabled,
    )


def source_bytes(cfg, source) -> float | None:
    """The text bytes a corpus source holds, as far as they can be told now (None: not)."""
    held = _source_held(cfg, source)
    return None if held is None else held["bytes"]


def _source_held(cfg, source) -> dict | None:
    """inputs_bytes of a source that can be sized whole now, else None."""
    held = inputs_bytes(source.inputs, cfg.corpus.fields_of(source).text)
    if any(r == "demo" or r.startswith("demo:") for r in held["remote"]):
        return None  # a share of the demo world: its size is known once it is made
    return None if held["remote"] or held["missing"] or not held["bytes"] else held


def read_size(cfg) -> Sized | None:
    """What the corpus stage reads when a source is read only as far as its share needs
    (hanlm.data.read_plan); None when none is. A source whose files cannot be sized now counts
    at the rate of text (its format is not known before it is read)."""
    from hanlm.data import read_plan  # deferred: the plan imports no data module otherwise

    needs = read_plan.needed_characters(cfg)
    if all(need is None for need in needs.values()):
        return None
    total, parquet, parts, estimated = 0.0, 0.0, [], False
    for source in cfg.corpus.source_list():
        held = _source_held(cfg, source)
        need, size = needs[source.name], held["bytes"] if held else None
        wanted = need * BYTES_PER_CHAR if need is not None else None
        if wanted is None and size is None:
            return None  # read whole and not sized: the whole-corpus estimate applies
        share = held["parquet_bytes"] / size if held else 0.0
        if wanted is not None and (size is None or wanted < size):
            total, parquet = total + wanted, parquet + wanted * share
            estimated = True
            of = f" of {size / GB:,.1f}" if size is not None else ""
            parts.append(
                f"{source.name} {wanted / GB:,.1f}{of} GB (its share x "
                f"{cfg.corpus.chars_per_token:g} chars/token x {cfg.corpus.read_margin:g} "
                f"margin x {BYTES_PER_CHAR:g} bytes/char)"
            )
        else:
            total, parquet = total + size, parquet + size * share
            parts.append(f"{source.name} whole, {size / GB:,.1f} GB")
    return Sized(total, "what the corpus stage reads: " + "; ".join(parts), estimated, parquet)


def mixture_preview(cfg) -> list[dict] | None:
    """The mix of a recipe with weighted sources, on the sources' sizes as far as they can be
    told now (local files, local snapshots and, online, a Hub dataset's parquet files: their
    text bytes, raw; the demo world: demo.size_mb; a stream, or the Hub offline: unsized)."""
    if not cfg.corpus.is_mixture:
        return None
    steps = cfg.pretrain.steps()
    if steps is None:
        return None  # no budget to split yet
    per_token = BYTES_PER_CHAR * cfg.corpus.chars_per_token
    available: dict[str, float | None] = {}
    for source in cfg.corpus.sources:
        size = source_bytes(cfg, source)
        available[source.name] = size / per_token if size is not None else None
    # deferred: the plan imports no data module otherwise
    from hanlm.data import read_plan
    from hanlm.data.mixture import preview

    rows = preview(cfg.corpus.sources, available, steps * cfg.pretrain.global_batch_tokens)
    needs = read_plan.needed_characters(cfg)
    for row in rows:
        need, have = needs[row["source"]], row["available"]
        reads = need / cfg.corpus.chars_per_token if need is not None else None
        row["reads"] = None if reads is None or (have is not None and reads >= have) else reads
        if row["reads"]:  # what it repeats is what was read, not what the source holds
            row["epochs"] = round(row["tokens"] / row["reads"], 3)
    return rows
