"""Text folding: the form of a text that decontamination matches, as arrays of code points.

Matching text is normalised the same way on both sides: Unicode NFC, Latin letters lower-cased,
every punctuation mark (category P*), separator (Z*) and control character (Cc) removed. What
is left is a string of characters without spaces, so a copy whose spacing, particles' spacing or
punctuation changed still matches (`normalise`). For speed a batch of texts is folded at once
(`fold_texts`): it becomes one array of code points (UTF-32), one table lookup folds and removes
and flags the characters NFC could change, so a batch with none needs no normalising; the
boundaries the removed characters made are kept (`Segments`) for the items that count only as
a whole segment.
"""

from __future__ import annotations

import functools
import itertools
import unicodedata
from collections.abc import Sequence

import numpy as np

from hanlm.data.decontam.hashing import distinct, gather

_LATIN = ((0x41, 0x24F), (0x1E00, 0x1EFF), (0xFF21, 0xFF3A))  # Basic, Latin-1, Extended, full-width


@functools.cache
def fold_table() -> np.ndarray:
    """Code point -> folded code point, 0 for a character matching ignores."""
    table = np.arange(0x110000, dtype=np.uint32)
    # Punctuation, separators and controls live in these blocks (CJK ones are listed below).
    for cp in itertools.chain(range(0x3000), range(0xFE00, 0x10000), range(0x16FE0, 0x17000)):
        category = unicodedata.category(chr(cp))
        if category[0] in "PZ" or category == "Cc":
            table[cp] = 0
    for cp in (0x3000, 0x3001, 0x3002, 0x3003, *range(0x3008, 0x3012), *range(0x3014, 0x3020)):
        table[cp] = 0  # CJK spaces, commas, full stops, brackets: used in Korean text too
    table[0x30FB] = 0  # katakana middle dot, used as a list separator
    for lo, hi in _LATIN:
        for cp in range(lo, hi + 1):
            lower = chr(cp).lower()
            if len(lower) == 1 and table[cp] != 0:
                table[cp] = ord(lower)
    return table


def nfc(text: str) -> str:
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def normalise(text: str) -> str:
    """The text matching sees: NFC, Latin lower-cased, no punctuation, spaces or controls."""
    chars, _ = fold(nfc(text))
    return chars.tobytes().decode("utf-32-le")


@functools.cache
def hard_table() -> np.ndarray:
    """Code point -> 1 for a character matching ignores that also ends a segment: punctuation,
    line breaks, tabs (everything ignored but spaces)."""
    hard = (fold_table() == 0).astype(np.uint8)
    for cp in range(0x3001):
        if unicodedata.category(chr(cp)) == "Zs":
            hard[cp] = 0
    return hard


_MAY_CHANGE = np.uint32(1 << 31)  # flags a character of `_bmp_fold_table` (folded ones are < 2^21)


@functools.cache
def _bmp_fold_table() -> np.ndarray:
    """`fold_table` over the BMP, with _MAY_CHANGE set on every character NFC may change or join
    to the one before it, and on surrogates. Text without any such character is NFC already
    (Unicode's NFC quick check: only starters, each allowed in NFC), so a batch of it needs no
    per-text `unicodedata.is_normalized`, which took a tenth of the scan."""
    table = fold_table()[:0x10000].copy()
    # Characters that join the one before them: the second of a two-character canonical
    # decomposition (planes 2 and up hold none), and the Hangul jamo (composed by rule).
    joiners = set()
    for cp in range(0x20000):
        decomposition = unicodedata.decomposition(chr(cp)).split()
        if len(decomposition) == 2 and not decomposition[0].startswith("<"):
            joiners.add(int(decomposition[1], 16))
    for cp in range(0x10000):
        char = chr(cp)
        if (
            cp in joiners
            or unicodedata.combining(char)
            or not unicodedata.is_normalized("NFC", char)
        ):
            table[cp] |= _MAY_CHANGE
    table[0x1100:0x1200] |= _MAY_CHANGE  # Hangul jamo
    table[0xD800:0xE000] |= _MAY_CHANGE  # surrogates: never alone in a str, but kept apart
    return table


def _nfc_texts(texts: list[str], suspects: np.ndarray) -> list[str]:
    """`texts` in NFC, checking only those holding a character at `suspects` (positions in
    the texts end to end)."""
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    texts = list(texts)  # a copy: the caller compares
    for i in distinct(np.searchsorted(ends, suspects, side="right")).tolist():
        texts[i] = nfc(texts[i])
    return texts


def prepare_tables() -> None:
    """Build the folding tables now (once per process: before workers fork, or a timed scan)."""
    _bmp_fold_table()
    hard_table()


def fold(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Folded code points of an NFC text and a keep mask over its original characters."""
    chars, keep, _ = fold_with_codepoints(text)
    return chars, keep


def fold_with_codepoints(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`fold`, and the text's code points (for segment boundaries: see Segments)."""
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = fold_table()
    # The common case, no character beyond the BMP: a 256 KB table that stays in cache.
    bmp = len(cps) and cps.max() < 0x10000
    # np.take and np.compress: about twice as fast as fancy and boolean indexing here.
    folded = np.take(table[:0x10000] if bmp else table, cps)
    keep = folded != 0
    return np.compress(keep, folded), keep, cps


class Segments:
    """Where the folded text of a batch had segment boundaries (punctuation, line breaks), read
    lazily from the original characters: only a few places are ever asked about."""

    def __init__(self, keep: np.ndarray, cps: np.ndarray, removed: np.ndarray | None = None):
        self.keep = keep  # over the original characters
        self.cps = cps  # the original code points
        self._removed = removed  # original positions of the removed characters, if known

    def bounded(self, starts: np.ndarray, ends: np.ndarray, doc_starts: np.ndarray,
                doc_ends: np.ndarray) -> np.ndarray:  # fmt: skip
        """Whether each folded span [start, end) is a whole segment: at a document edge or next
        to a hard boundary on both sides (a space alone is none)."""
        if not hasattr(self, "_gap"):
            # Only the removed characters matter (a quarter of the text or so): the ones in the
            # gap before kept character k are those with k kept characters before them.
            removed = self._removed
            if removed is None:
                removed = np.flatnonzero(~self.keep)
            self._gap = removed - np.arange(len(removed))
            hard = hard_table()[np.minimum(self.cps[removed], 0xFFFF)]
            self._hard = np.concatenate([[0], np.cumsum(hard, dtype=np.int64)])

        def hard_gap(k):  # a hard character among the removed ones just before kept char k
            lo = np.searchsorted(self._gap, k, side="left")
            hi = np.searchsorted(self._gap, k, side="right")
            return self._hard[hi] > self._hard[lo]

        before = np.ones(len(starts), dtype=bool)
        inner = starts > doc_starts
        before[inner] = hard_gap(starts[inner])
        after = np.ones(len(starts), dtype=bool)
        inner = ends < doc_ends
        after[inner] = hard_gap(ends[inner])
        return before & after


def fold_texts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, Segments]:
    """Folded characters of several texts end to end, where each starts (plus the end), and
    their segment boundaries."""
    texts = list(texts)
    cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
    beyond_bmp = bool(len(cps)) and cps.max() >= 0x10000
    folded = gather(_bmp_fold_table(), cps & 0xFFFF if beyond_bmp else cps)
    if beyond_bmp or (len(folded) and folded.max() >= _MAY_CHANGE):
        # Rare: a character NFC may change, or one beyond the BMP. Only the texts holding one
        # are normalised (where they need it); the others are NFC already.
        suspects = np.flatnonzero((folded >= _MAY_CHANGE) | (cps >= 0x10000))
        normal = _nfc_texts(texts, suspects)
        changed = any(new is not old for new, old in zip(normal, texts, strict=True))
        if changed:
            texts = normal
            cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        if changed or beyond_bmp:
            folded = gather(fold_table(), cps)
        else:
            folded &= ~_MAY_CHANGE
    keep = folded != 0
    chars = np.compress(keep, folded)
    raw_ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    # Kept characters before each document end = its raw end minus the removed ones before it.
    removed = np.flatnonzero(~keep)
    doc_starts = np.concatenate([[0], raw_ends - np.searchsorted(removed, raw_ends)])
    return chars, doc_starts, Segments(keep, cps, removed)
