"""Exact and near-duplicate removal in four steps whose memory does not grow with the corpus.

1. signatures (in each corpus task): every kept document's 128-bit content hash and its MinHash
   signature cut into LSH bands, sorted and written per task and band in datatrove's signature
   layout (`bucket_NNN/RRRRR.minhash.sig`: the band's hashes then the document's index);
2. pairs (one task per band, plus one for the content hashes): each band's sorted files are
   read range by range of the hash space (so never the whole band in memory) and the documents
   that agree on the whole band are paired, as datatrove's MinhashDedupBuckets pairs them (the
   same pairs, 10-20x faster: numpy over memory-mapped slices instead of a heap of Python
   objects; tests/unit/test_dedup.py checks the two agree);
3. clusters (one task): a band's pair is kept when the two whole signatures agree on at least
   `threshold` of their columns (the estimated Jaccard; one byte of each column is kept for
   this, 1/16 of the input's size at most); the pairs are joined by union-find over duplicated
   documents only; each cluster keeps its earliest document (the corpus order), the others are
   removed, as exact duplicates when they have an identical earlier twin, else as near ones;
4. filter (in each corpus task): the task's removal list applied as its documents are written.

Shingles are characters of the folded text (no whitespace or punctuation, lower case), see
minhash.FOLDED.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datatrove.pipeline.base import PipelineStep

from hanlm.data import minhash

EXACT, NEAR = "exact", "near"
REASON_EXACT, REASON_NEAR = 1, 2
KEPT_BY_FILE = "kept_by.json"  # [task of removed documents, task that kept their cluster, count]
REMOVE_DTYPE = np.dtype([("index", "<u4"), ("reason", "u1")])
CONTENT_HASH_WORDS = 4  # 128 bits as four uint32


@functools.lru_cache(maxsize=64)
def lsh_bands(threshold: float, num_perm: int, recall: float = 0.95) -> tuple[int, int]:
    """(bands, rows), bands * rows <= num_perm, such that a pair with Jaccard `threshold` becomes
    a candidate with probability >= `recall` (P = 1 - (1 - J^rows)^bands) and, among those, the
    fewest pairs below the threshold do (the least area under P from 0 to the threshold).

    Recall first: datasketch's choice puts P = 0.5 at the threshold, so half of the pairs just
    above it stay; here they are found and the curve's foot lies below the threshold instead."""
    grid = np.linspace(0.0, threshold, 501)
    best, best_area = None, math.inf
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold**rows) ** bands < recall:
            continue
        area = float(np.trapezoid(1.0 - (1.0 - grid**rows) ** bands, grid))
        if area < best_area:
            best, best_area = (bands, rows), area
    return best or (num_perm, 1)


@dataclass(frozen=True)
class DedupSettings:
    near: bool
    num_perm: int
    ngram: int
    seed: int
    threshold: float

    @property
    def bands(self) -> tuple[int, int]:
        return lsh_bands(self.threshold, self.num_perm)

    def words(self, kind: str) -> int:
        """Hashes per record of one kind's signature files (32-bit each)."""
        return self.bands[1] if kind == NEAR else CONTENT_HASH_WORDS

    @property
    def kinds(self) -> int:
        """Signature files per corpus task: the content hashes, and each band when near."""
        return 1 + (self.bands[0] if self.near else 0)


def _record_dtype(words: int) -> np.dtype:
    return np.dtype([(f"h{i}", "<u4") for i in range(words)] + [("doc", "<u4")])


def _record_order(hashes: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """The indices that sort the records by (hashes..., doc). One sort on the first 64 bits
    (np.lexsort on every word costs several times more: a pass per word), then the records that
    tie there (copies, mostly) sorted again on everything within their runs."""
    key = hashes[:, 0].astype(np.uint64) << np.uint64(32)
    if hashes.shape[1] > 1:
        key |= hashes[:, 1]
    order = np.argsort(key, kind="stable")
    ranked = key[order]
    tie = ranked[1:] == ranked[:-1]
    if tie.any():
        tied = np.zeros(len(order), dtype=bool)
        tied[1:] |= tie
        tied[:-1] |= tie
        at = np.flatnonzero(tied)  # whole runs of equal keys, in key order
        group = order[at]
        words = [hashes[group, i] for i in reversed(range(hashes.shape[1]))]
        order[at] = group[np.lexsort([docs[group], *words])]
    return order


class SignatureWriter:
    """One task's signatures, held until the task ends (bounded by the task's size), then
    sorted and written per band."""

    def __init__(self, root: Path, rank: int, settings: DedupSettings):
        self.root, self.rank, self.settings = Path(root), rank, settings
        self._hashes: list[np.ndarray] = []
        self._sigs: list[np.ndarray] = []
        self.count = 0
        self._full = None
        if settings.near:
            path = full_signature_path(self.root, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._full = open(path, "wb")  # noqa: SIM115 - closed in close()

    def add(self, texts: list[str]) -> None:
        if not texts:
            return
        self._hashes.append(minhash.content_hashes(texts))
        if self.settings.near:
            settings = self.settings
            sig = minhash.signatures(
                texts, num_perm=settings.num_perm, ngram=settings.ngram, seed=settings.seed
            )
            bands, rows = settings.bands
            self._sigs.append(sig[:, : bands * rows])
            self._full.write(sig.astype(np.uint8).tobytes())  # low byte: enough to verify
        self.count += len(texts)

    def close(self) -> None:
        docs = np.arange(self.count, dtype=np.uint32)
        hashes = np.concatenate(self._hashes) if self._hashes else np.zeros((0, 4), np.uint32)
        self._write(EXACT, 0, hashes, docs)
        if self.settings.near:
            bands, rows = self.settings.bands
            empty = np.zeros((0, bands * rows), np.uint32)
            sigs = np.concatenate(self._sigs) if self._sigs else empty
            for band in range(bands):
                self._write(NEAR, band, sigs[:, band * rows : (band + 1) * rows], docs)
        self._hashes = self._sigs = []
        if self._full is not None:
            self._full.close()

    def _write(self, kind: str, band: int, hashes: np.ndarray, docs: np.ndarray) -> None:
        words = self.settings.words(kind)
        records = np.empty(len(docs), _record_dtype(words))
        for i in range(words):
            records[f"h{i}"] = hashes[:, i]
        records["doc"] = docs
        # lexicographic order of (hashes..., doc): datatrove's merge reads each file in order
        order = _record_order(hashes, docs)
        path = self.root / kind / f"bucket_{band:03d}" / f"{self.rank:05d}.minhash.sig"
        path.parent.mkdir(parents=True, exist_ok=True)
        records[order].tofile(path)


class FindDuplicatePairs(PipelineStep):
    """Step 2: the content hashes and each LSH band ("kinds": 0 is the content hashes, b + 1
    band b), `kinds_per_task` of them to a task, each cut into `ranges` ranges of the hash space
    (a big corpus gets more tasks than kinds; a small one fewer). Task r covers kinds
    (r // ranges) * kinds_per_task onwards and range r % ranges; it writes datatrove's pair file
    per kind (`BBBBB_RR.dups`: task, doc, task, doc as uint32). Equal records share their first
    hash, so every group lies in one range."""

    name = "🔗 duplicate pairs"
    type = "🫂 - DEDUP"

    def __init__(
        self, signatures: Path, pairs: Path, settings: DedupSettings, ranges: int = 1,
        kinds_per_task: int = 1,
    ):  # fmt: skip
        super().__init__()
        self.signatures, self.pairs, self.settings = str(signatures), str(pairs), settings
        self.ranges, self.kinds_per_task = ranges, kinds_per_task

    @property
    def tasks(self) -> int:
        return math.ceil(self.settings.kinds / self.kinds_per_task) * self.ranges

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        group, part = divmod(rank, self.ranges)
        first = group * self.kinds_per_task
        for index in range(first, min(first + self.kinds_per_task, self.settings.kinds)):
            self.stat_update("pairs", value=self._pairs(index, part))

    def _pairs(self, index: int, part: int) -> int:
        kind, bucket = (EXACT, 0) if index == 0 else (NEAR, index - 1)
        folder = Path(self.signatures) / kind / f"bucket_{bucket:03d}"
        out = Path(self.pairs) / kind / f"{bucket:05d}_{part:02d}.dups"
        out.parent.mkdir(parents=True, exist_ok=True)
        lo, hi = (1 << 32) * part // self.ranges, (1 << 32) * (part + 1) // self.ranges
        files = sorted(folder.glob("*.minhash.sig"))
        return band_pairs(files, self.settings.words(kind), out, lo=lo, hi=hi)


PAIRS_CHUNK_RECORDS = 1 << 21  # records held at once: memory stays flat however big the band


def band_pairs(files: list[Path], words: int, out: Path, *, lo: int = 0, hi: int = 1 << 32) -> int:
    """Pairs of records with equal hashes, first hash in [lo, hi), across the sorted signature
    files of one band, in the order of (task, document): each record paired with the previous
    one of its group, as datatrove's merge pairs them. Each file is sorted by its first hash, so
    the range is cut into pieces of about PAIRS_CHUNK_RECORDS records and each piece is read from
    every file (a slice of a memory map), grouped with one sort and written: memory does not
    grow with the corpus, and no record is handled by Python one at a time."""
    maps = [
        (int(f.name.split(".")[0]), np.memmap(f, "<u4", "r").reshape(-1, words + 1))
        for f in files
        if f.stat().st_size
    ]  # each record: `words` hashes then the document, as uint32
    share = (hi - lo) / (1 << 32)  # of the records, as the hashes are uniform
    pieces = max(1, math.ceil(sum(len(m) for _, m in maps) * share / PAIRS_CHUNK_RECORDS))
    bounds = [lo + (hi - lo) * i // pieces for i in range(pieces + 1)]
    found = 0
    with open(out, "wb") as f:
        for lo, hi in itertools.pairwise(bounds):
            chunks, tasks = [], []
            for task, records in maps:
                first = records[:, 0]
                a, b = np.searchsorted(first, [lo, hi]) if hi < 1 << 32 else (
                    np.searchsorted(first, lo), len(records))  # fmt: skip
                if b > a:
                    chunks.append(np.asarray(records[a:b]))
                    tasks.append(np.full(b - a, task, np.uint32))
            if not chunks:
                continue
            records, task = np.concatenate(chunks), np.concatenate(tasks)
            key = records[:, 0].astype(np.uint64)
            for i in range(1, words):  # one 64-bit key per record; ties are checked below
                key = (key * np.uint64(0x9E3779B97F4A7C15)) ^ records[:, i]
            order = np.argsort(key, kind="stable")  # stable: (task, document) order within ties
            key = key[order]
            later = np.flatnonzero(key[1:] == key[:-1]) + 1  # positions in `order`
            # equal keys almost always mean equal hashes: compare the few candidates in full
            earlier_rows, later_rows = order[later - 1], order[later]
            same = (records[earlier_rows, :words] == records[later_rows, :words]).all(axis=1)
            earlier_rows, later_rows = earlier_rows[same], later_rows[same]
            if len(later_rows):
                pairs = np.stack(
                    [
                        task[earlier_rows],
                        records[earlier_rows, words],
                        task[later_rows],
                        records[later_rows, words],
                    ],
                    axis=1,
                ).astype("<u4")
                f.write(pairs.tobytes())
                found += len(pairs)
    return found


def full_signature_path(root: Path, rank: int) -> Path:
    return Path(root) / "full" / f"{rank:05d}.u8"


def estimated_jaccard(root: Path, num_perm: int, pairs: np.ndarray) -> np.ndarray:
    """The share of equal columns of each pair's whole signatures (one byte of each column;
    equal bytes of unequal hashes, 1 in 256, are taken out of the estimate)."""
    if not len(pairs):
        return np.zeros(0)
    signatures = {}

    def rows(tasks: np.ndarray, docs: np.ndarray) -> np.ndarray:
        out = np.empty((len(tasks), num_perm), np.uint8)
        for task in np.unique(tasks).tolist():
            if task not in signatures:
                path = full_signature_path(root, task)
                signatures[task] = np.memmap(path, np.uint8, "r").reshape(-1, num_perm)
            mask = tasks == task
            out[mask] = signatures[task][docs[mask]]
        return out

    equal = (rows(pairs[:, 0], pairs[:, 1]) == rows(pairs[:, 2], pairs[:, 3])).mean(axis=1)
    return np.clip((equal - 1 / 256) / (1 - 1 / 256), 0.0, 1.0)


def _unique_pairs(pairs: np.ndarray) -> np.ndarray:
    """Each pair once (two 64-bit keys sorted together: far cheaper than np.unique(axis=0))."""
    if not len(pairs):
        return pairs
    first = (pairs[:, 0].astype(np.uint64) << np.uint64(32)) | pairs[:, 1]
    second = (pairs[:, 2].astype(np.uint64) << np.uint64(32)) | pairs[:, 3]
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    keep = np.ones(len(order), bool)
    keep[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
    return pairs[order[keep]]


def _read_pairs(folder: Path) -> np.ndarray:
    """(n, 4) uint32 pairs (task, doc, task, doc) from every .dups file in `folder`."""
    files = sorted(Path(folder).glob("*.dups"))
    arrays = [np.fromfile(f, dtype="<u4").reshape(-1, 4) for f in files]
    return np.concatenate(arrays) if arrays else np.zeros((0, 4), np.uint32)


class ClusterDuplicates(PipelineStep):
    """Step 3 (one task): union-find over the pairs; every cluster keeps its earliest document.
    Writes each corpus task's sorted removal list (`RRRRR.npy`: index and reason)."""

    name = "🧩 duplicate clusters"
    type = "🫂 - DEDUP"

    def __init__(self, signatures: Path, pairs: Path, removals: Path, settings: DedupSettings):
        super().__init__()
        self.signatures, self.pairs, self.removals = str(signatures), str(pairs), str(removals)
        self.settings = settings

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        exact = _read_pairs(Path(self.pairs) / EXACT)
        near = _unique_pairs(_read_pairs(Path(self.pairs) / NEAR))  # found in several bands
        similar = estimated_jaccard(Path(self.signatures), self.settings.num_perm, near)
        self.stat_update("candidate_pairs", value=len(near))
        near = near[similar >= self.settings.threshold]
        key = lambda a: (a[:, 0].astype(np.int64) << 32) | a[:, 1]  # noqa: E731
        exact_a, exact_b = key(exact[:, :2]), key(exact[:, 2:])
        near_a, near_b = key(near[:, :2]), key(near[:, 2:])
        parent: dict[int, int] = {}

        def find(x: int) -> int:
            root = x
            while (up := parent.get(root, root)) != root:
                root = up
            while x != root:  # path compression
                parent[x], x = root, parent.get(x, x)
            return root

        for a, b in zip(
            np.concatenate([exact_a, near_a]).tolist(),
            np.concatenate([exact_b, near_b]).tolist(),
            strict=True,
        ):
            ra, rb = find(a), find(b)
            if ra != rb:  # the earlier document is the root, so each cluster keeps its first
                parent[max(ra, rb)] = min(ra, rb)
        # the later document of an identical pair has an identical earlier twin
        exact_later = set(exact_b.tolist())
        removed = sorted(node for node in parent if find(node) != node)
        by_task: dict[int, list[tuple[int, int]]] = {}
        kept_by: Counter = Counter()  # (task of a removed document, task of its cluster's kept one)
        for node in removed:
            reason = REASON_EXACT if node in exact_later else REASON_NEAR
            by_task.setdefault(node >> 32, []).append((node & 0xFFFFFFFF, reason))
            kept_by[node >> 32, find(node) >> 32] += 1
        out = Path(self.removals)
        out.mkdir(parents=True, exist_ok=True)
        for task, rows in by_task.items():
            np.array(rows, dtype=REMOVE_DTYPE).tofile(out / f"{task:05d}.remove")
        rows = [[removed_in, kept_in, n] for (removed_in, kept_in), n in sorted(kept_by.items())]
        (out / KEPT_BY_FILE).write_text(json.dumps(rows))
        self.stat_update("pairs", value=len(exact_a) + len(near_a))
        self.stat_update("removed", value=len(removed))


def read_kept_by(removals: Path) -> list[tuple[int, int, int]]:
    """(task of removed documents, task of the documents that kept their clusters, how many)."""
    path = Path(removals) / KEPT_BY_FILE
    return [tuple(row) for row in json.loads(path.read_text())] if path.is_file() else []


def read_removals(removals: Path, rank: int) -> dict[int, int]:
    """Index -> reason of the documents task `rank` drops (empty when it drops none)."""
    path = Path(removals) / f"{rank:05d}.remove"
    if not path.is_file():
        return {}
    rows = np.fromfile(path, dtype=REMOVE_DTYPE)
    return dict(zip(rows["index"].tolist(), rows["reason"].tolist(), strict=True))
