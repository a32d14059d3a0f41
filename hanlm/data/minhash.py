"""Vectorised MinHash signatures for near-duplicate detection of Korean documents, and exact hashes.

`signatures` hashes the character n-grams ("shingles") of each text folded as FOLDED says and
returns one `num_perm`-column uint32 signature per text; the fraction of equal columns of two
signatures estimates the Jaccard similarity of their shingle sets. `content_hashes` gives a
128-bit hash of each text's exact UTF-8 bytes for exact deduplication.

Design (measured in benchmarks/minhash_speed.py): one-permutation hashing (OPH) with optimal
densification (Li, Owen & Zhang 2012; Shrivastava 2017) instead of `num_perm` independent hash
functions. The whole batch is handled at once in numpy:

1. all texts are joined and encoded to one UTF-32 code-point array, folded with one lookup
   table over the Basic Multilingual Plane: whitespace (exactly what `str.split()` splits on)
   and punctuation dropped, letters lower-cased;
2. every position gets the hash of the n-gram starting there: a seeded linear combination of the
   n code points mod 2^32 (an almost-universal hash of the n-gram), then murmur3's fmix32;
3. each hash picks one of `num_perm` bins from its high bits, and `np.minimum.at` keeps the
   smallest hash per (document, bin); n-grams that cross a document boundary go to a discarded
   slot. A hash determines its bin, so two equal columns always come from the same bin;
4. documents left with empty bins (few shingles) hash their shingles again with a fresh mixer,
   up to `_ROUNDS` rounds; an empty bin takes the minimum of the first round that reaches it
   (as in Dahlgaard, Knudsen & Thorup's fast similarity sketching). Without this, bin
   collisions among few shingles made the spread up to 1.3x the binomial; with it, 0.7-0.8x;
5. a bin still empty borrows the value of the first non-empty bin of that document along a
   fixed, seeded random probe order of all bins (one order per bin). Two documents borrow alike
   for bins empty in both, which keeps the estimator unbiased.

One hash per shingle (plus a few rounds for short documents) instead of `num_perm` makes this
several times faster than independent hash functions in numpy (KorQuAD paragraphs, 2 cores:
~67 MB/s against ~16 MB/s) and ~50-80x datasketch; the estimator is unbiased with a spread at
or below the binomial sqrt(J(1-J)/num_perm) of classic MinHash, short or long texts alike.

Everything is fixed-width integer arithmetic (uint32 wraps mod 2^32) with parameters derived from
`seed` by SplitMix64, so results are the same across processes, runs, platforms and numpy
versions, and each text's signature depends only on that text: batching does not matter.
Memory is O(total code points) plus O(len(texts) * num_perm).
"""

from __future__ import annotations

import functools
import hashlib
import string
import unicodedata
from collections.abc import Sequence

import numpy as np

__all__ = ["FOLDED", "content_hashes", "signatures"]

FOLDED = (
    "whitespace, punctuation and case (as datatrove's MinHash normalises, with digits kept: "
    "Korean word problems and numeric facts that differ only in their numbers are different "
    "text; syllables stay whole, NFC, not decomposed into jamo)"
)
# Why each: Korean spacing varies ('나는 학교에', '나는학교에'); a copy re-punctuated throughout is
# the same text; Latin terms in Korean text change case. A shingle of 5 syllables spans ~2 words.

_EMPTY = np.uint32(0xFFFFFFFF)  # an empty bin before densification
_PAD = 0x110000  # not a code point: fills the one shingle of a text shorter than `ngram`
_MAX_PERM = 1 << 16  # bins come from the hash's top 16 bits
_ROUNDS = 16  # hashing rounds for documents with empty bins before borrowing from other bins
_CHUNK_CHARS = 1 << 20  # texts are processed in groups of about this many code points (cache)

# What shingling reads of a text (see FOLDED): each code point of the Basic Multilingual Plane
# mapped to its lower case, or to _DROP for whitespace and punctuation; others kept as they are.
_DROP = np.uint32(0xFFFFFFFF)
_BMP = 0x10000


def _fold_table() -> np.ndarray:
    table = np.arange(_BMP, dtype=np.uint32)
    ascii_punctuation = set(string.punctuation)  # datatrove's too: $ + < = > ^ ` | ~ with P*
    for code in range(_BMP):
        char = chr(code)
        if char.isspace() or char in ascii_punctuation or unicodedata.category(char)[0] == "P":
            table[code] = _DROP
        elif len(lower := char.lower()) == 1:
            table[code] = ord(lower)
    return table


_FOLD = _fold_table()


# ---------------------------------------------------------------------------------------------
# Parameters


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _random_words(seed: int, stream: int, count: int) -> np.ndarray:
    """`count` pseudo-random uint64 words for (`seed`, `stream`); stable forever."""
    root = _splitmix64(np.array([seed % (1 << 64)], dtype=np.uint64))
    start = _splitmix64(root ^ np.uint64(stream))[0]
    with np.errstate(over="ignore"):
        return _splitmix64(start + np.arange(count, dtype=np.uint64))


@functools.lru_cache(maxsize=16)
def _parameters(num_perm: int, ngram: int, seed: int):
    words = _random_words(seed, 1, ngram + 1)
    multipliers = (words[:ngram] | np.uint64(1)).astype(np.uint32)  # odd: invertible mod 2^32
    offset = np.uint32(words[ngram] & np.uint64(0xFFFFFFFF))
    mixes = (_random_words(seed, 3, _ROUNDS) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    # probe[b] is the order in which an empty bin b looks for a non-empty bin to borrow from
    keys = _random_words(seed, 2, num_perm * num_perm).reshape(num_perm, num_perm)
    probe = np.argsort(keys, axis=1, kind="stable").astype(np.intp)
    # the probing loop reads column t of all bins at once: keep columns contiguous
    return multipliers, offset, mixes, np.ascontiguousarray(probe.T)


# ---------------------------------------------------------------------------------------------
# Hashing


def _fmix32(h: np.ndarray) -> np.ndarray:
    """murmur3's finaliser (a bijection of uint32), in place."""
    tmp = np.empty_like(h)
    np.right_shift(h, 16, out=tmp)
    h ^= tmp
    h *= np.uint32(0x85EBCA6B)
    np.right_shift(h, 13, out=tmp)
    h ^= tmp
    h *= np.uint32(0xC2B2AE35)
    np.right_shift(h, 16, out=tmp)
    h ^= tmp
    return h


def _bins(h: np.ndarray, num_perm: int, out: np.ndarray | None = None) -> np.ndarray:
    """The bin of each hash, from its top 16 bits: floor(top16 * num_perm / 2^16)."""
    b = np.right_shift(h, np.uint32(16), out=out)
    b *= np.uint32(num_perm)
    b >>= np.uint32(16)
    return b


def _compact(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The folded code points of all texts (FOLDED: no whitespace or punctuation, lower case),
    joined, and each text's end in them."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lengths)
    data = "".join(texts).encode("utf-32-le", "surrogatepass")
    points = np.frombuffer(data, dtype="<u4")
    folded = _FOLD[np.minimum(points, np.uint32(_BMP - 1))]
    beyond = np.flatnonzero(points >= _BMP)  # emoji, rare CJK: as they are
    folded[beyond] = points[beyond]
    drop = folded == _DROP
    drop_at = np.flatnonzero(drop)
    if drop_at.size == 0:
        return folded, ends
    ends -= np.searchsorted(drop_at, ends)  # dropped code points before each end
    return folded[~drop], ends


def _signatures_chunk(texts: Sequence[str], num_perm: int, ngram: int, seed: int) -> np.ndarray:
    multipliers, offset, mixes, probe = _parameters(num_perm, ngram, seed)
    docs, k, n = len(texts), num_perm, ngram
    points, ends = _compact(texts)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1]
    lengths = ends - starts
    trash = docs * k  # an extra row for the n-grams that cross a document boundary
    sig = np.full(trash + k, _EMPTY, dtype=np.uint32)

    # every n-gram of the joined text: a linear hash of its code points, then fmix32
    width = points.size - n + 1
    base = linear = None
    if width > 0:
        linear = points[:width] * multipliers[0]
        linear += offset
        tmp = np.empty_like(linear)
        for j in range(1, n):
            np.multiply(points[j : j + width], multipliers[j], out=tmp)
            linear += tmp
        h = _fmix32(linear ^ mixes[0])
        base = np.repeat(np.arange(0, trash, k, dtype=np.intp), lengths)[:width]
        # n-grams starting in the last n-1 positions of a document cross into the next one
        last = ends[:, None] - np.arange(1, n, dtype=np.int64)[None, :]
        last = last[(last >= starts[:, None]) & (last < width)]
        base[last] = trash
        np.minimum.at(sig, base + _bins(h, k, tmp), h)
        del h, tmp

    # a text shorter than n: one shingle, its compact text padded with a non-code-point
    short = np.flatnonzero(lengths < n)
    short_linear = None
    if short.size:
        col = np.arange(n, dtype=np.int64)
        inside = col[None, :] < lengths[short, None]
        at = np.where(inside, starts[short, None] + col[None, :], 0)
        grams = np.full((short.size, n), _PAD, dtype=np.uint32)
        grams[inside] = points[at[inside]]
        short_linear = (grams * multipliers[None, :]).sum(axis=1, dtype=np.uint32) + offset
        h = _fmix32(short_linear ^ mixes[0])
        sig[short * k + _bins(h, k)] = h

    sig = sig[:trash].reshape(docs, k)
    _more_rounds(sig, mixes, base, linear, short, short_linear)
    _densify(sig, probe)
    return sig


def _more_rounds(sig, mixes, base, linear, short, short_linear) -> None:
    """Fill empty bins, in place, by hashing the documents' shingles again (fresh hash per round).

    A bin keeps the minimum over the shingles that fell into it in the first round that reached
    it; rounds stop when every bin of a document is filled or after len(mixes) rounds.
    """
    docs, k = sig.shape
    rows = np.flatnonzero((sig == _EMPTY).any(axis=1))
    if rows.size == 0 or len(mixes) < 2:
        return
    need = np.zeros(docs + 1, dtype=bool)  # + the trash row
    need[rows] = True
    parts_linear, parts_owner = [], []
    if base is not None:
        owner = base // k
        take = np.flatnonzero(need[owner])
        parts_linear.append(linear[take])
        parts_owner.append(owner[take])
    if short.size:
        take = need[short]
        parts_linear.append(short_linear[take])
        parts_owner.append(short[take])
    linear = np.concatenate(parts_linear)
    row_of = np.zeros(docs, dtype=np.intp)
    row_of[rows] = np.arange(rows.size)
    owner = row_of[np.concatenate(parts_owner)] * k
    sub = sig[rows]
    for mix in mixes[1:]:
        h = _fmix32(linear ^ mix)
        found = np.full(sub.size, _EMPTY, dtype=np.uint32)
        np.minimum.at(found, owner + _bins(h, k), h)
        empty = sub.reshape(-1) == _EMPTY
        sub.reshape(-1)[empty] = found[empty]
        still = (sub == _EMPTY).any(axis=1)
        if not still.all():  # write back the finished documents, go on with the rest
            sig[rows[~still]] = sub[~still]
            rows, sub = rows[still], sub[still]
            if rows.size == 0:
                return
            keep = still[owner // k]
            renumber = np.cumsum(still) - 1
            owner = renumber[owner[keep] // k] * k
            linear = linear[keep]
    sig[rows] = sub


def _densify(sig: np.ndarray, probe: np.ndarray) -> None:
    """Fill each empty bin, in place, from the first non-empty bin along its probe order."""
    doc, bin_ = np.nonzero(sig == _EMPTY)
    if doc.size == 0:
        return
    fill = np.full(doc.size, _EMPTY, dtype=np.uint32)
    pending = np.arange(doc.size)
    for t in range(probe.shape[0]):
        value = sig[doc[pending], probe[t, bin_[pending]]]
        found = value != _EMPTY
        fill[pending[found]] = value[found]
        pending = pending[~found]
        if pending.size == 0:
            break
    sig[doc, bin_] = fill  # reads above saw only the original bins


def signatures(texts: Sequence[str], *, num_perm: int, ngram: int, seed: int) -> np.ndarray:
    """(len(texts), num_perm) uint32 MinHash signatures of each text's character n-grams.

    The n-grams ("shingles") are taken from the text with all whitespace removed (the code
    points `str.split()` splits on), so '나는 학교에' and '나는학교에' give the same signature. A
    text whose whitespace-free form is shorter than `ngram` has one shingle: the whole compact
    text (an empty one included). The fraction of equal columns of two signatures estimates the
    Jaccard similarity of their shingle sets (one-permutation hashing with optimal
    densification, see the module's docstring).

    Deterministic for a given (`num_perm`, `ngram`, `seed`) across processes, runs and
    platforms, and independent of batching: signatures(a + b) equals the stacked signatures(a)
    and signatures(b). Texts are not normalised here (NFC them first).
    """
    if not 1 <= num_perm <= _MAX_PERM:
        raise ValueError(f"num_perm must be in 1..{_MAX_PERM}, got {num_perm}")
    if ngram < 1:
        raise ValueError(f"ngram must be at least 1, got {ngram}")
    out = np.empty((len(texts), num_perm), dtype=np.uint32)
    first = chars = 0
    for i, text in enumerate(texts):
        chars += len(text)
        if chars >= _CHUNK_CHARS:
            out[first : i + 1] = _signatures_chunk(texts[first : i + 1], num_perm, ngram, seed)
            first, chars = i + 1, 0
    if first < len(texts) or not len(texts):
        out[first:] = _signatures_chunk(texts[first:], num_perm, ngram, seed)
    return out


def content_hashes(texts: Sequence[str]) -> np.ndarray:
    """(len(texts), 4) uint32: the 128-bit BLAKE2b hash of each text's exact UTF-8 bytes.

    For exact deduplication: equal texts have equal rows, different texts (almost surely)
    different rows. The bytes of the digest are read little-endian on every platform.
    """
    digests = b"".join(
        hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in texts
    )
    return np.frombuffer(digests, dtype="<u4").astype(np.uint32).reshape(len(texts), 4)
