"""Deduplication's steps: pairs equal to datatrove's own merge, LSH bands, clusters' choices."""

import itertools

import numpy as np
import pytest
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets
from datatrove.utils.hashing import HashConfig

from hanlm.data import dedup


def write_band(folder, task: int, hashes: np.ndarray) -> None:
    """A task's sorted signature file of one band (datatrove's layout)."""
    words = hashes.shape[1]
    records = np.empty(len(hashes), dedup._record_dtype(words))
    for i in range(words):
        records[f"h{i}"] = hashes[:, i]
    records["doc"] = np.arange(len(hashes), dtype=np.uint32)
    order = np.lexsort([records["doc"]] + [hashes[:, i] for i in reversed(range(words))])
    folder.mkdir(parents=True, exist_ok=True)
    records[order].tofile(folder / f"{task:05d}.minhash.sig")


def pairs_of(path) -> list[tuple]:
    return sorted(map(tuple, np.fromfile(path, "<u4").reshape(-1, 4).tolist()))


@pytest.mark.parametrize("chunk", [1 << 21, 7])
def test_band_pairs_equal_datatrove_merge(tmp_path, monkeypatch, chunk):
    """The same pairs as datatrove's MinhashDedupBuckets, also when the hash space is read in
    many small ranges (memory bounded)."""
    monkeypatch.setattr(dedup, "PAIRS_CHUNK_RECORDS", chunk)
    rng = np.random.default_rng(0)
    words, tasks = 3, 4
    pool = rng.integers(0, 2**32 - 1, size=(10, words), dtype=np.uint64).astype(np.uint32)
    for task in range(tasks):
        n = int(rng.integers(0, 60))  # task 0 may be empty
        unique = rng.integers(0, 2**32 - 1, size=(n, words), dtype=np.uint64).astype(np.uint32)
        shared = pool[rng.integers(0, len(pool), size=n)]  # duplicates within and across tasks
        hashes = np.where(rng.random((n, 1)) < 0.4, shared, unique)
        write_band(tmp_path / "sig" / "bucket_000", task, hashes)
    files = sorted((tmp_path / "sig" / "bucket_000").glob("*.sig"))
    found = dedup.band_pairs(files, words, tmp_path / "mine.dups")
    config = MinhashConfig(
        num_buckets=1, hashes_per_bucket=words, hash_config=HashConfig(precision=32, hash_fc="sha1")
    )
    MinhashDedupBuckets(str(tmp_path / "sig"), str(tmp_path / "dt"), config=config).run(None, 0, 1)
    reference = pairs_of(tmp_path / "dt" / "00000_00.dups")
    assert found == len(reference) > 10
    assert pairs_of(tmp_path / "mine.dups") == reference


@pytest.mark.parametrize("threshold", [0.7, 0.8, 0.85, 0.9])
@pytest.mark.parametrize("num_perm", [64, 128, 256])
def test_lsh_bands_find_pairs_at_the_threshold(threshold, num_perm):
    bands, rows = dedup.lsh_bands(threshold, num_perm)
    assert bands * rows <= num_perm

    grid = np.linspace(0, threshold, 501)

    def p(j, b=bands, r=rows):
        return 1 - (1 - j**r) ** b

    assert p(threshold) >= 0.95
    # of all bandings that find 95% at the threshold, none has fewer candidates below it
    area = np.trapezoid(p(grid), grid)
    for r in range(1, num_perm + 1):
        if p(threshold, num_perm // r, r) >= 0.95:
            assert np.trapezoid(p(grid, num_perm // r, r), grid) >= area - 1e-12


def cluster(tmp_path, exact_pairs, near_pairs, signatures=None, threshold=0.8, num_perm=8):
    for kind, pairs in ((dedup.EXACT, exact_pairs), (dedup.NEAR, near_pairs)):
        folder = tmp_path / "pairs" / kind
        folder.mkdir(parents=True, exist_ok=True)
        np.array(pairs, dtype="<u4").reshape(-1, 4).tofile(folder / "00000_00.dups")
    for task, rows in (signatures or {}).items():
        path = dedup.full_signature_path(tmp_path / "sig", task)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.array(rows, dtype=np.uint8).tofile(path)
    settings = dedup.DedupSettings(
        near=True, num_perm=num_perm, ngram=5, seed=0, threshold=threshold
    )
    step = dedup.ClusterDuplicates(tmp_path / "sig", tmp_path / "pairs", tmp_path / "rm", settings)
    step.run(None, 0, 1)
    return {task: dedup.read_removals(tmp_path / "rm", task) for task in range(3)}


def test_clusters_keep_the_earliest_document_and_name_the_reason(tmp_path):
    same = [[1] * 8] * 4  # every document's whole signature equal: all near pairs verify
    removed = cluster(
        tmp_path,
        exact_pairs=[(1, 0, 2, 3)],  # task 2 doc 3 is an identical copy of task 1 doc 0
        near_pairs=[(1, 2, 1, 0), (1, 0, 0, 1), (0, 1, 2, 0)],  # a chain: 1.2 ~ 1.0 ~ 0.1 ~ 2.0
        signatures={0: same, 1: same, 2: same},
    )
    assert removed[0] == {}  # 0.1 is the chain's earliest document: kept
    assert removed[1] == {0: dedup.REASON_NEAR, 2: dedup.REASON_NEAR}
    assert removed[2] == {0: dedup.REASON_NEAR, 3: dedup.REASON_EXACT}


def test_near_pairs_below_the_threshold_are_not_removed(tmp_path):
    base = list(range(10))
    close = [*base[:9], 200]  # 9 of 10 columns equal
    far = [*base[:5], 200, 201, 202, 203, 204]  # 5 of 10
    removed = cluster(
        tmp_path,
        exact_pairs=[],
        near_pairs=[(0, 0, 0, 1), (0, 0, 0, 2)],
        signatures={0: [base, close, far]},
        threshold=0.8,
        num_perm=10,
    )
    assert removed[0] == {1: dedup.REASON_NEAR}


def test_pairs_of_hash_ranges_add_up_to_the_whole_band(tmp_path):
    rng = np.random.default_rng(1)
    pool = rng.integers(0, 2**32 - 1, size=(30, 2), dtype=np.uint64).astype(np.uint32)
    for task in range(3):
        write_band(tmp_path / "sig", task, pool[rng.integers(0, len(pool), size=80)])
    files = sorted((tmp_path / "sig").glob("*.sig"))
    whole = dedup.band_pairs(files, 2, tmp_path / "whole.dups")
    bounds = [0, 1 << 30, 3 << 30, 1 << 32]
    pieces = []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        dedup.band_pairs(files, 2, tmp_path / f"{i}.dups", lo=lo, hi=hi)
        pieces += pairs_of(tmp_path / f"{i}.dups")
    assert whole > 50 and sorted(pieces) == pairs_of(tmp_path / "whole.dups")


@pytest.mark.parametrize("words", [1, 2, 4])
def test_signature_records_are_written_in_lexicographic_order(words):
    """The one-sort order equals np.lexsort over every word and the document, with copies,
    records equal in their first 64 bits only, and shuffled document numbers."""
    rng = np.random.default_rng(words)
    n = 4000
    hashes = rng.integers(0, 2**32, (n, words), dtype=np.uint64).astype(np.uint32)
    hashes[rng.integers(0, n, 800)] = hashes[rng.integers(0, n, 800)]  # copies
    hashes[rng.integers(0, n, 400), 0] = 7  # a common first word
    if words > 2:
        copies = rng.integers(0, n, 200)
        hashes[copies] = hashes[0]
        hashes[copies[:100], -1] ^= 1  # equal in the first 64 bits only
    docs = rng.permutation(n).astype(np.uint32)
    expected = np.lexsort([docs, *(hashes[:, i] for i in reversed(range(words)))])
    np.testing.assert_array_equal(dedup._record_order(hashes, docs), expected)
