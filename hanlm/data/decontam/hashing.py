"""Rolling 64-bit hashes of folded characters, and the lookups that test them against a set.

This is the numeric layer of decontamination (numpy only, no text): character n-grams of any
length hashed from one prefix sum, 32-bit keys of a text's first characters, a bit filter and a
bucketed sorted array that say which hashes are in a set, and the two array helpers the package
uses throughout (`gather`, `distinct`).

Window hashes cost the same whatever n is: with c_j the characters and B an odd constant,
Q[i] = sum_{j<i} c_j B^-j and hash(i..i+n) = B^(i+n-1) (Q[i+n] - Q[i]), modulo 2^64 (numpy's
wrapping uint64), then one xor-shift-multiply round. Set lookups need no Python loop and no
binary search: `BitFilter`, a table over the top hash bits about 1.5% full, rules out almost
every window with one memory read, and `SortedHashes` finds the rest by their top bits.
"""

from __future__ import annotations

import functools

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so invertible modulo 2^64
_BASE_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_SHIFT = np.uint64(29)


def gather(table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """np.take(table, indices) for indices known to be in range: mode "wrap" is numpy's
    cheapest bounds handling (about 10% faster than the default on these large gathers)."""
    return np.take(table, indices, mode="wrap")


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: np.unique by sorting (numpy 2's np.unique hashes integers,
    several times slower on the few thousand hits of a batch)."""
    values = np.sort(values)
    first = np.ones(len(values), dtype=bool)
    first[1:] = values[1:] != values[:-1]
    return values[first]


@functools.lru_cache(maxsize=4)
def _powers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """B^k and B^-k modulo 2^64 for k < size."""
    with np.errstate(over="ignore"):
        forward = np.full(size, _BASE, dtype=np.uint64)
        forward[0] = 1
        backward = np.full(size, _BASE_INV, dtype=np.uint64)
        backward[0] = 1
        return np.cumprod(forward, dtype=np.uint64), np.cumprod(backward, dtype=np.uint64)


def powers(size: int) -> tuple[np.ndarray, np.ndarray]:
    # Rounded up so that growing batches reuse one cached table.
    return _powers(max(1 << 20, 1 << (max(size, 1) - 1).bit_length()))


def prefix_sums(chars: np.ndarray) -> np.ndarray:
    """Q with Q[i] = sum_{j<i} c_j B^-j (mod 2^64), length len(chars) + 1."""
    size = len(chars)
    _, backward = powers(size + 1)
    q = np.zeros(size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.multiply(chars.astype(np.uint64), backward[:size], out=q[1:])
        np.cumsum(q[1:], out=q[1:])
    return q


def _mix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h ^= h >> _SHIFT
        h *= _MIX
    return h


def hashes_at(q: np.ndarray, starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Hashes of windows of different widths."""
    forward, _ = powers(len(q))
    with np.errstate(over="ignore"):
        h = q[starts + widths] - q[starts]
        h *= forward[starts + widths - 1]
    return _mix(h)


def window_hashes(q: np.ndarray, n: int, starts: np.ndarray | None = None) -> np.ndarray:
    """Hashes of the length-n windows starting at `starts` (default: every start)."""
    forward, _ = powers(len(q))
    with np.errstate(over="ignore"):
        if starts is None:
            h = q[n:] - q[:-n]
            h *= forward[n - 1 : len(q) - 1]
        else:
            # offset views rather than starts + n: no index arithmetic on every start
            h = gather(q[n:], starts) - gather(q, starts)
            h *= gather(forward[n - 1 :], starts)
    return _mix(h)


def prefix_keys(chars: np.ndarray, width: int) -> np.ndarray:
    """A 32-bit key of the `width` characters starting at every position (32-bit arithmetic:
    half the memory traffic of the 64-bit hashes)."""
    size = len(chars) - width + 1
    if size <= 0:
        return np.zeros(0, dtype=np.uint32)
    with np.errstate(over="ignore"):
        key = chars[:size] * np.uint32(0x9E3779B1)
        for j in range(1, width):
            key += chars[j : j + size]
            key *= np.uint32(0x85EBCA6B)
        key ^= key >> np.uint32(15)
    return key


class BitFilter:
    """A table over the top bits of a set of hashes, about 1.5% full: most lookups say no.

    A byte per entry while the table fits in a CPU cache, else a bit per entry."""

    BYTE_TABLE_LIMIT = 1 << 18

    def __init__(self, hashes: np.ndarray):
        bits = int(min(30, max(12, np.ceil(np.log2(max(len(hashes), 1) * 64)))))
        self._shift = np.uint64(64 - bits)
        top = (hashes >> self._shift).astype(np.int64)
        self._bytes = None
        if 1 << bits <= self.BYTE_TABLE_LIMIT:
            self._bytes = np.zeros(1 << bits, dtype=bool)  # bool: np.flatnonzero's fast path
            self._bytes[top] = True
            return
        words = np.zeros(1 << (bits - 6), dtype=np.uint64)
        np.bitwise_or.at(words, top >> 6, np.left_shift(np.uint64(1), (top & 63).astype(np.uint64)))
        self._words = words

    def candidates(self, hashes: np.ndarray) -> np.ndarray:
        """Indices of `hashes` that may be in the set."""
        top = (hashes >> self._shift).view(np.int64)
        if self._bytes is not None:
            return np.flatnonzero(gather(self._bytes, top))
        word = gather(self._words, top >> 6)
        word >>= (top & 63).view(np.uint64)
        word &= np.uint64(1)
        return np.flatnonzero(word != 0)  # a bool array: np.flatnonzero's fast path


class SortedHashes:
    """Sorted 64-bit hashes (repeats allowed) found by their top bits: a table of where each
    value of the top bits starts in the sorted array leaves a bucket of one or two hashes to
    compare, instead of a binary search (some 18 dependent reads, each a cache miss)."""

    def __init__(self, hashes: np.ndarray):
        self.hashes = hashes
        bits = max(1, int(np.log2(max(len(hashes), 2))))  # one to two hashes per bucket
        self._shift = np.uint64(64 - bits)
        bucket_starts = np.arange(1 << bits, dtype=np.uint64) << self._shift
        self._bounds = np.append(np.searchsorted(hashes, bucket_starts), len(hashes))

    def find(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(i, j) for every queries[i] equal to hashes[j], in order of i then j."""
        bucket = (queries >> self._shift).view(np.int64)
        lo = np.take(self._bounds, bucket)
        count = np.take(self._bounds, bucket + 1) - lo
        which = np.repeat(np.arange(len(queries)), count)
        # places lo .. lo + count - 1 of each query, laid end to end
        where = np.arange(len(which)) + np.repeat(lo - (np.cumsum(count) - count), count)
        equal = np.take(self.hashes, where) == np.take(queries, which)
        return which[equal], where[equal]
