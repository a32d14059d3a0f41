"""The benchmark index: the hashed units of every benchmark item, and the scan of text for them.

`BenchmarkIndex.build` folds the items' entries (hanlm.data.decontam.folding: NFC, Latin
lower-cased, no punctuation, spaces or controls), hashes their character n-grams to 64 bits
(hanlm.data.decontam.hashing) and ties them to the items (hanlm.data.decontam.entries);
`scan_texts` finds those units in a batch of documents, `resolve` and `item_coverage` turn the
hits into what each document holds of each item, `check` and `matches` into per-item coverage
and status; `save` and `load` keep it in one .npz file.

Why n = 27 by default: lm-evaluation-harness and the GPT-3 paper call a test item dirty when it
shares a 13-word n-gram with training data. On the parallel English/Korean GSM8K test questions
(`../shared/data/gsm8k-ko`), one English word corresponds to a median of 2.07 Korean characters
once spaces and punctuation are gone, so 13 words are about 27 characters: specific enough that
unrelated text practically never shares one (a whole Korean clause), short enough that a
sentence-sized leak still has several. Items whose normalised text is shorter than n are
matched as a whole.

Items are looked for as one string and part by part: a COPA premise and its right answer
joined by a connective, cause first ("…되어서, …"), or a line apart are one leak; either
sentence alone, a common phrase, is none. Coverage is the share of an item's characters found,
of its whole text or of its parts together, whichever is higher.

Speed (no Python loop per character), besides the folding and hashing of whole batches:

* strided windows: long items are looked for only at every STRIDE-th window of a document, and
  around each window found its neighbours are checked. A copied stretch of n + STRIDE - 1 or
  more characters always has a window on the grid, so every n-gram of it is found, exactly as
  by checking every window; items too short for that guarantee are checked at every window;
* filters: most windows are ruled out by one memory read (`BitFilter`), the rest looked up by
  their top bits (`SortedHashes`: no binary search);
* items shorter than n (and the short ones above) are found through an anchor, their first
  characters: a 32-bit key of up to 4 characters at every position, then the exact hash of the
  whole item at the few places whose key matches.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hanlm.data.decontam.entries import (
    ALONE,
    WHOLE,
    WITH_OTHERS,
    item_entries,
    number_units,
    pair_tables,
)
from hanlm.data.decontam.folding import (
    Segments,
    fold_table,
    fold_texts,
    fold_with_codepoints,
    hard_table,
    nfc,
)
from hanlm.data.decontam.hashing import (
    BitFilter,
    SortedHashes,
    distinct,
    gather,
    hashes_at,
    prefix_keys,
    prefix_sums,
    window_hashes,
)
from hanlm.errors import UserError
from hanlm.files import atomic_write_bytes

DEFAULT_NGRAM = 27
ANCHOR = 8  # at most this many first characters of a short item locate candidate places
KEY_CHARS = 4  # characters in the cheap 32-bit key that finds anchor candidates
SCAN_CHARS = 256_000  # characters hashed at once: the arrays of a batch stay in the CPU caches
# A longer text is scanned in windows of about this many characters (BenchmarkIndex._scan_long):
# the scan's arrays hold ~45 bytes per character and a document may be any size; windows of a
# batch's size also stay in the caches (an 8 M-character text: 0.3 s against 1.5 s whole).
LONG_TEXT_CHARS = SCAN_CHARS
STRIDE = 4  # long entries: windows hashed every STRIDE characters, neighbours of a hit checked;
# a copied stretch of n + STRIDE - 1 = 30 characters is always found (half of a short passage)
STEM_DROP = 2  # a short part's final characters that may change form (its ending)
STEM_MIN = 4  # ... as long as this much of it is left to look for
FORMAT_VERSION = 2


@dataclass
class BatchHits:
    """Distinct (document, unit) hits of one batch; `units` index the index's unit table."""

    documents: np.ndarray  # int64, batch-local document index
    units: np.ndarray  # int64
    positions: np.ndarray  # int64, start in the document's normalised text (first occurrence)


@dataclass
class Held:
    """What a batch of documents held of the benchmark, part rules applied.

    `pairs`: the (entry, unit) pairs found where they count (indices into the index's pair
    table); `documents`, `items`, `counts`: per document and item it holds, how many pairs."""

    pairs: np.ndarray
    documents: np.ndarray
    items: np.ndarray
    counts: np.ndarray


class BenchmarkIndex:
    """Hashed units of every benchmark item, looked for as a whole and part by part.

    Each item gives *entries*: its whole overlap text (kind WHOLE), and when it has several
    distinguishing parts (COPA premise and right alternative, BoolQ passage and question, ...)
    one entry per part. A part of n characters or more stands alone (ALONE: a copied n-gram is
    evidence enough); a shorter part counts only in a document that holds every part of the
    item (WITH_OTHERS), so a common short sentence alone never makes an item dirty, while the
    item written out in its natural form (parts reordered, a connective or a line between them,
    lm-eval's prompt around them) is found. An item may also bring other forms to look for as a
    whole (FORM: the prompt lm-evaluation-harness scores, for a one-part item such as SentiNeg,
    whose short text alone counts only as a whole segment, see `scan_folded`).

    An entry's units are its n-grams, or, when it is shorter than n, the whole entry; a short
    part is looked for by its stem, all but its last STEM_DROP characters, so that a sentence
    whose final ending changes when it is joined to the next (시작되었다 -> 시작되어서,
    시작되었기 때문이다) is still found. A unit is one distinct (length, hash); pairs tie
    entries to units (`pair_entry`, `pair_unit`, by unit through `unit_ptr`/`unit_pairs`), and
    `pos_pair` lists the pair at every position of every entry (CSR by `pos_ptr`; -1 where the
    n-gram is template text, see hanlm.data.decontam.entries) for character coverage.

    Some units carry an anchor, the hash of their first `anchor_length` characters (one length
    for all), and are looked for at every position: the short ones, and the n-grams of entries
    too short for the strided scan to be exact (shorter than n + STRIDE - 1).
    """

    def __init__(self, *, ngram, benchmarks, item_ids, entry_item, entry_kind, entry_length,
                 unit_hashes, unit_lengths, unit_ptr, unit_pairs, pair_entry, pair_unit,
                 pos_ptr, pos_pair, anchor_length, anchor_units, anchor_hashes,
                 anchor_keys):  # fmt: skip
        self.ngram = int(ngram)
        self.benchmarks = list(benchmarks)
        self.item_ids = list(item_ids)
        self.entry_item = np.asarray(entry_item, dtype=np.int64)
        self.entry_kind = np.asarray(entry_kind, dtype=np.int8)
        self.entry_length = np.asarray(entry_length, dtype=np.int64)  # normalised characters
        self.unit_hashes = np.asarray(unit_hashes, dtype=np.uint64)  # sorted
        self.unit_lengths = np.asarray(unit_lengths, dtype=np.int64)  # n, or a short unit's
        self.unit_ptr = np.asarray(unit_ptr, dtype=np.int64)
        self.unit_pairs = np.asarray(unit_pairs, dtype=np.int64)
        self.pair_entry = np.asarray(pair_entry, dtype=np.int64)
        self.pair_unit = np.asarray(pair_unit, dtype=np.int64)
        self.pos_ptr = np.asarray(pos_ptr, dtype=np.int64)
        self.pos_pair = np.asarray(pos_pair, dtype=np.int64)
        self.anchor_length = int(anchor_length)
        self.anchor_units = np.asarray(anchor_units, dtype=np.int64)
        self.anchor_hashes = np.asarray(anchor_hashes, dtype=np.uint64)  # per anchor unit
        self.anchor_keys = np.asarray(anchor_keys, dtype=np.int64)  # 32-bit keys of their start
        self._prepare()

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def build(cls, items: Sequence, *, ngram: int = DEFAULT_NGRAM) -> BenchmarkIndex:
        """Hash every entry's n-grams (or whole text or stem, when shorter than `ngram`)."""
        if ngram < 2:
            raise UserError(f"decontam n-gram length must be at least 2, got {ngram}")
        texts, entry_item, entry_kind = item_entries(items)
        chars, text_starts, _ = fold_texts(texts)
        lengths = np.diff(text_starts)
        entry_item, entry_kind = np.array(entry_item), np.array(entry_kind, dtype=np.int8)
        entry_kind[(entry_kind == ALONE) & (lengths < ngram)] = WITH_OTHERS
        q = prefix_sums(chars)
        long = np.flatnonzero(lengths >= ngram)
        short = np.flatnonzero((lengths > 0) & (lengths < ngram))
        short_widths = lengths[short].copy()
        stem = (entry_kind[short] == WITH_OTHERS) & (short_widths - STEM_DROP >= STEM_MIN)
        short_widths[stem] -= STEM_DROP
        anchor_length = int(min(ANCHOR, short_widths.min())) if len(short) else ANCHOR
        # Every (entry, position) row: n-grams of long entries, one unit of each short entry.
        starts = np.concatenate([_grid(text_starts[long], text_starts[long + 1], ngram, 1),
                                 text_starts[short]])  # fmt: skip
        owners = np.concatenate([np.repeat(long, np.maximum(0, lengths[long] - ngram + 1)), short])
        widths = np.concatenate([np.full(len(starts) - len(short), ngram), short_widths])
        rows = np.lexsort((starts, owners))  # entry by entry, positions in order
        starts, owners, widths = starts[rows], owners[rows], widths[rows]
        hashes = hashes_at(q, starts, widths)
        unit_of, unit_hashes, unit_lengths, first_start = number_units(hashes, widths, starts)
        pair_entry, pair_unit, pos_ptr, pos_pair = pair_tables(
            owners, unit_of, unit_lengths == ngram, entry_item, len(texts), len(items)
        )
        unit_pairs = np.argsort(pair_unit, kind="stable")
        unit_ptr = np.concatenate(
            [[0], np.cumsum(np.bincount(pair_unit, minlength=len(unit_hashes)))]
        )
        # Units looked for at every position: short ones, and the n-grams of entries the
        # strided scan could miss when copied alone into the middle of a document.
        medium = (lengths >= ngram) & (lengths < ngram + STRIDE - 1)
        anchored = unit_lengths < ngram
        anchored[pair_unit[medium[pair_entry]]] = True
        anchored &= np.bincount(pair_unit, minlength=len(unit_hashes)) > 0
        anchor_units = np.flatnonzero(anchored)
        anchor_hashes = hashes_at(
            q, first_start[anchor_units], np.minimum(anchor_length, unit_lengths[anchor_units])
        )
        key_width = min(anchor_length, KEY_CHARS)
        anchor_keys = prefix_keys(chars, key_width)[first_start[anchor_units]]
        return cls(
            ngram=ngram,
            benchmarks=[i.benchmark for i in items],
            item_ids=[i.item_id for i in items],
            entry_item=entry_item,
            entry_kind=entry_kind,
            entry_length=lengths,
            unit_hashes=unit_hashes,
            unit_lengths=unit_lengths,
            unit_ptr=unit_ptr,
            unit_pairs=unit_pairs,
            pair_entry=pair_entry,
            pair_unit=pair_unit,
            pos_ptr=pos_ptr,
            pos_pair=pos_pair,
            anchor_length=anchor_length,
            anchor_units=anchor_units,
            anchor_hashes=anchor_hashes,
            anchor_keys=anchor_keys,
        )

    def _prepare(self) -> None:
        """Derived tables, and bit tables over the top hash bits (most windows are ruled out by
        one memory read)."""
        n_items = len(self.item_ids)
        self.pairs_per_item = np.bincount(
            self.entry_item[self.pair_entry], minlength=n_items
        ).astype(np.int64)
        # Parts an item needs in one document: those with anything left to find.
        live = np.bincount(self.pair_entry, minlength=len(self.entry_item)) > 0
        self._is_part = (self.entry_kind == ALONE) | (self.entry_kind == WITH_OTHERS)
        self.parts_per_item = np.bincount(self.entry_item[self._is_part & live], minlength=n_items)
        # Units that count only as a whole segment: the whole text of a short one-part item.
        # (Shared with another entry, a unit is looked for by that entry's rule instead.)
        alone = (self.entry_kind == WHOLE) & (self.entry_length < self.ngram)
        parts = np.bincount(self.entry_item[self._is_part], minlength=n_items)
        alone &= parts[self.entry_item] == 0
        per_unit = np.bincount(self.pair_unit, minlength=len(self.unit_hashes))
        self._segment_units = (
            np.bincount(self.pair_unit, alone[self.pair_entry], minlength=len(self.unit_hashes))
            == per_unit
        ) & (per_unit > 0)
        # Entry widths in characters covered per position: n, or the whole short entry.
        self._entry_width = np.minimum(self.entry_length, self.ngram)
        full = self.unit_lengths == self.ngram
        self._full_hashes = self.unit_hashes[full]
        self._full_units = np.flatnonzero(full)
        self._full_filter = BitFilter(self._full_hashes)
        self._full_lookup = SortedHashes(self._full_hashes)
        order = np.argsort(self.anchor_hashes, kind="stable")
        self._anchor_lookup = SortedHashes(self.anchor_hashes[order])
        self._anchor_units = self.anchor_units[order]
        bits = int(min(24, max(10, np.ceil(np.log2(max(len(self.anchor_keys), 1) * 64)))))
        self._key_shift = np.uint32(32 - bits)
        self._key_table = np.zeros(1 << bits, dtype=bool)  # bool: np.flatnonzero's fast path
        self._key_table[self.anchor_keys.astype(np.uint32) >> self._key_shift] = 1

    # -- persistence ---------------------------------------------------------------------------

    _ARRAYS = ("entry_item", "entry_kind", "entry_length", "unit_hashes", "unit_lengths",
               "unit_ptr", "unit_pairs", "pair_entry", "pair_unit", "pos_ptr", "pos_pair",
               "anchor_units", "anchor_hashes", "anchor_keys")  # fmt: skip

    def save(self, path: Path) -> None:
        """One .npz file (no pickles), written to a temporary name and renamed."""
        buffer = io.BytesIO()
        np.savez(
            buffer,
            format=np.array([FORMAT_VERSION, self.ngram, self.anchor_length], dtype=np.int64),
            benchmarks=np.array(self.benchmarks, dtype=str),
            item_ids=np.array(self.item_ids, dtype=str),
            **{name: getattr(self, name) for name in self._ARRAYS},
        )
        atomic_write_bytes(Path(path), buffer.getvalue())

    @classmethod
    def load(cls, path: Path) -> BenchmarkIndex:
        try:
            with np.load(Path(path), allow_pickle=False) as archive:
                version, ngram, anchor_length = (int(v) for v in archive["format"])
                if version != FORMAT_VERSION:
                    raise ValueError(f"index format {version}, expected {FORMAT_VERSION}")
                return cls(
                    ngram=ngram,
                    anchor_length=anchor_length,
                    benchmarks=archive["benchmarks"].tolist(),
                    item_ids=archive["item_ids"].tolist(),
                    **{name: archive[name] for name in cls._ARRAYS},
                )
        except (OSError, ValueError, KeyError) as e:
            raise UserError(
                f"cannot read the decontamination index: {e}",
                where=str(path),
                fix="rebuild it (`hanlm decontam --force`)",
            ) from None

    # -- scanning ------------------------------------------------------------------------------

    def scan_folded(self, chars: np.ndarray, doc_starts: np.ndarray,
                    segments: Segments | None = None, grid_offset: int = 0) -> BatchHits:  # fmt: skip
        """Hits in a batch of folded documents laid end to end (`doc_starts` ends with the end).
        `grid_offset`: the stride grid starts this many characters into each document (a window
        of a longer text keeps the text's grid).

        A short item of one part (a SentiNeg review, say) counts only as a whole segment, never
        inside a longer sentence ("최고네요" is not found in "가성비 최고네요"); without
        `segments`, only document edges bound it.

        Long items: windows are hashed only every STRIDE characters of each document; around
        every window found, its neighbours are checked too. Every copied stretch of at least
        n + STRIDE - 1 characters has a window on the grid, so all of its n-grams are found,
        exactly as by a scan of every window, for a STRIDE-th of the hashing.
        """
        n = self.ngram
        q = prefix_sums(chars)
        found_pos, found_units = [], []
        starts, ends = doc_starts[:-1], doc_starts[1:]
        if len(self._full_hashes):
            grid = _grid(starts + grid_offset, ends, n, STRIDE)
            pos, units = self._lookup_full(q, grid)
            if len(pos):
                doc = np.searchsorted(doc_starts, pos, side="right") - 1
                near = (pos[:, None] + np.arange(1 - STRIDE, STRIDE)[None, :]).ravel()
                doc = np.repeat(doc, 2 * STRIDE - 1)
                inside = (near >= starts[doc]) & (near + n <= ends[doc])
                near = distinct(near[inside])
                pos, units = self._lookup_full(q, near)
            found_pos.append(pos)
            found_units.append(units)
        if len(self.anchor_hashes) and len(chars) >= self.anchor_length:
            pos, units = self._scan_short(chars, q, len(chars))
            doc = np.searchsorted(doc_starts, pos, side="right") - 1
            end = pos + self.unit_lengths[units]
            inside = end <= ends[doc]
            alone = self._segment_units[units] & inside
            if alone.any():
                if segments is None:
                    ok = (pos[alone] == starts[doc[alone]]) & (end[alone] == ends[doc[alone]])
                else:
                    ok = segments.bounded(pos[alone], end[alone], starts[doc[alone]],
                                          ends[doc[alone]])  # fmt: skip
                inside[np.flatnonzero(alone)[~ok]] = False
            found_pos.append(pos[inside])
            found_units.append(units[inside])
        if not found_pos:
            return BatchHits(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
        positions = np.concatenate(found_pos)
        units = np.concatenate(found_units)
        docs = np.searchsorted(doc_starts, positions, side="right") - 1
        # Distinct (document, unit), keeping the first position.
        order = np.lexsort((positions, units, docs))
        docs, units, positions = docs[order], units[order], positions[order]
        first = np.ones(len(docs), dtype=bool)
        first[1:] = (docs[1:] != docs[:-1]) | (units[1:] != units[:-1])
        return BatchHits(docs[first], units[first], positions[first] - doc_starts[docs[first]])

    def _lookup_full(self, q: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows among `starts` whose n-gram is an item unit: (positions, units)."""
        if not len(starts):
            return starts, starts
        h = window_hashes(q, self.ngram, starts)
        candidates = self._full_filter.candidates(h)
        which, where = self._full_lookup.find(h[candidates])
        return starts[candidates[which]], self._full_units[where]

    def _scan_short(self, chars, q: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Places where a whole short item occurs: anchor candidates, then exact hashes."""
        anchor = self.anchor_length
        if size < anchor:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        # First a cheap 32-bit key of the anchors' first characters, then their 64-bit hashes.
        keys = prefix_keys(chars, min(anchor, KEY_CHARS)) >> self._key_shift
        pos = np.flatnonzero(gather(self._key_table, keys))
        pos = pos[pos + anchor <= size]
        # Every (place, short unit with this anchor) pair, checked with the unit's full length.
        which, where = self._anchor_lookup.find(window_hashes(q, anchor, pos))
        pos, units = pos[which], self._anchor_units[where]
        lengths = self.unit_lengths[units]
        fits = pos + lengths <= size
        pos, units, lengths = pos[fits], units[fits], lengths[fits]
        ok = hashes_at(q, pos, lengths) == self.unit_hashes[units]
        return pos[ok], units[ok]

    def scan_texts(self, texts: Sequence[str]) -> tuple[BatchHits, np.ndarray]:
        """Hits in a batch of texts, and the folded length of each text. A text longer than
        LONG_TEXT_CHARS is scanned in windows (_scan_long): the same hits, in bounded memory."""
        long = [i for i, text in enumerate(texts) if len(text) > LONG_TEXT_CHARS]
        if not long:
            chars, doc_starts, segments = fold_texts(texts)
            return self.scan_folded(chars, doc_starts, segments), np.diff(doc_starts)
        lengths = np.zeros(len(texts), dtype=np.int64)
        short = np.setdiff1d(np.arange(len(texts)), long)
        parts = []
        if len(short):
            chars, doc_starts, segments = fold_texts([texts[i] for i in short.tolist()])
            hits = self.scan_folded(chars, doc_starts, segments)
            parts.append((short[hits.documents], hits.units, hits.positions))
            lengths[short] = np.diff(doc_starts)
        for i in long:
            units, positions, lengths[i] = self._scan_long(texts[i])
            parts.append((np.full(len(units), i, dtype=np.int64), units, positions))
        docs, units, positions = (np.concatenate([p[k] for p in parts]) for k in range(3))
        order = np.lexsort((positions, units, docs))
        return BatchHits(docs[order], units[order], positions[order]), lengths

    def _scan_long(self, text: str) -> tuple[np.ndarray, np.ndarray, int]:
        """(units, first positions, folded length) of one long text, scanned window by window:
        the hits of a scan of the whole text, in memory for LONG_TEXT_CHARS characters.

        The text is cut into stretches of at most LONG_TEXT_CHARS characters, each scanned
        together with the next `margin` folded characters (the longest unit and the neighbours
        a strided window checks), with the text's stride grid. A cut goes before a space that
        follows a hard character (punctuation, a line break): no NFC composition crosses it,
        and a segment boundary is one in the window and in the whole text alike. So every hit
        of the whole text is found in the window holding its start, and a window finds nothing
        the whole text does not. A stretch without such a place is cut before a space, else at
        its limit, where a short item right at the cut may be found differently."""
        text = nfc(text)
        table, hard = fold_table(), hard_table()
        margin = int(self.unit_lengths.max(initial=self.ngram)) + 2 * STRIDE + 1
        units, positions = [], []
        start = offset = 0  # the stretch's start in the text, folded characters before it
        while True:
            last = len(text) - start <= LONG_TEXT_CHARS
            end = len(text) if last else _cut_before(text, start + LONG_TEXT_CHARS, hard)
            stop = len(text) if last else _cut_after(text, end, margin, table, hard)
            chars, doc_starts, segments = fold_texts([text[start:stop]])
            hits = self.scan_folded(chars, doc_starts, segments, grid_offset=-offset % STRIDE)
            units.append(hits.units)
            positions.append(hits.positions + offset)
            if last:
                total = offset + len(chars)
                break
            cps = np.frombuffer(text[start:end].encode("utf-32-le"), dtype=np.uint32)
            offset += int(np.count_nonzero(gather(table, cps)))
            start = end
        units, positions = np.concatenate(units), np.concatenate(positions)
        order = np.lexsort((positions, units))  # each unit's first place
        units, positions = units[order], positions[order]
        first = np.ones(len(units), dtype=bool)
        first[1:] = units[1:] != units[:-1]
        return units[first], positions[first], total

    # -- per-item results ------------------------------------------------------------------------

    def resolve(self, hits: BatchHits) -> Held:
        """Apply the part rules to a batch's hits: a short part counts only in a document that
        holds every part of its item."""
        counts = self.unit_ptr[hits.units + 1] - self.unit_ptr[hits.units]
        docs = np.repeat(hits.documents, counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        pairs = self.unit_pairs[np.repeat(self.unit_ptr[hits.units], counts) + offsets]
        entries = self.pair_entry[pairs]
        items = self.entry_item[entries]
        n_items = max(len(self.item_ids), 1)
        doc_item = docs * n_items + items
        needs_others = self.entry_kind[entries] == WITH_OTHERS
        if needs_others.any():
            # Documents holding every part of an item: distinct (document, part entry) hits,
            # counted per (document, item).
            part = self._is_part[entries]
            held = distinct(docs[part] * len(self.entry_item) + entries[part])
            held_doc, held_entry = np.divmod(held, len(self.entry_item))
            keys, parts = np.unique(
                held_doc * n_items + self.entry_item[held_entry], return_counts=True
            )
            complete = keys[parts == self.parts_per_item[keys % n_items]]
            ok = ~needs_others | np.isin(doc_item, complete)
            pairs, doc_item = pairs[ok], doc_item[ok]
        keys, counts = np.unique(doc_item, return_counts=True)
        return Held(distinct(pairs), keys // n_items, keys % n_items, counts)

    def item_coverage(self, pair_found: np.ndarray, items: np.ndarray | None = None):
        """Per item (all, or `items`): the share of its characters found, as the best of its
        whole text (or another form) and its parts together, and the whole text's share alone.

        A found n-gram covers its n characters, a found short unit its whole entry; characters
        covered only by template n-grams (`pos_pair` -1) count on neither side of the share."""
        if items is None:
            entries = np.arange(len(self.entry_item))
        else:
            entries = np.flatnonzero(np.isin(self.entry_item, items))
        covered, coverable = self._entry_cover(entries, pair_found)
        n_items = len(self.item_ids)
        owner = self.entry_item[entries]
        part = self._is_part[entries]
        whole_cov = np.zeros(n_items)  # the best of the whole text and its other forms
        np.maximum.at(whole_cov, owner[~part], covered[~part] / np.maximum(coverable[~part], 1))
        part_cov = np.bincount(owner[part], covered[part], minlength=n_items) / np.maximum(
            np.bincount(owner[part], coverable[part], minlength=n_items), 1
        )
        best = np.maximum(whole_cov, part_cov)
        if items is not None:
            return best[items], whole_cov[items]
        return best, whole_cov

    def _entry_cover(self, entries: np.ndarray, pair_found: np.ndarray):
        """(characters covered by found units, characters any unit covers) of each entry."""
        counts = self.pos_ptr[entries + 1] - self.pos_ptr[entries]
        local = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = np.repeat(self.pos_ptr[entries], counts) + local
        owner = np.repeat(np.arange(len(entries)), counts)
        width = self._entry_width[entries][owner]
        pair = self.pos_pair[rows]
        kept = pair >= 0
        found = kept & pair_found[np.maximum(pair, 0)]

        def union(mask):
            # Equal-width windows at increasing starts: each adds the gap to the next, at most
            # its width.
            o, s, w = owner[mask], local[mask], width[mask]
            nxt = np.empty_like(s)
            nxt[:-1], nxt[-1:] = s[1:], -1
            same = np.zeros(len(o), dtype=bool)
            same[:-1] = o[1:] == o[:-1]
            add = np.where(same, np.minimum(nxt - s, w), w)
            return np.bincount(o, add, minlength=len(entries))

        return union(found), union(kept)

    def status(self, coverage: float, *, dirty: float = 0.8, clean: float = 0.2) -> str:
        return "dirty" if coverage >= dirty else "clean" if coverage < clean else "partial"

    def check(self, texts: Iterable[str], *, dirty: float = 0.8, clean: float = 0.2,
              batch_chars: int = SCAN_CHARS) -> list[dict]:  # fmt: skip
        """Per item: coverage over all `texts`, status, how it was found (`whole` text or only
        by `parts`), and the indices of texts holding it (most of the item first)."""
        found = np.zeros(len(self.pair_entry), dtype=bool)
        per_item: dict[int, list[tuple[float, int]]] = {}
        for offset, batch in batches(texts, batch_chars):
            hits, _ = self.scan_texts(batch)
            held = self.resolve(hits)
            found[held.pairs] = True
            for doc, item, count in zip(held.documents, held.items, held.counts, strict=True):
                share = count / max(self.pairs_per_item[item], 1)
                per_item.setdefault(int(item), []).append((-share, offset + int(doc)))
        cov, whole = self.item_coverage(found)
        out = []
        for i in range(len(self.item_ids)):
            docs = [d for _, d in sorted(per_item.get(i, []))]
            status = self.status(cov[i], dirty=dirty, clean=clean)
            out.append(
                {
                    "benchmark": self.benchmarks[i],
                    "item_id": self.item_ids[i],
                    "coverage": round(float(cov[i]), 4),
                    "status": status,
                    "found_by": self.found_by(status, whole[i], dirty=dirty, clean=clean),
                    "documents": docs,
                }
            )
        return out

    def found_by(self, status: str, whole_coverage: float, **thresholds) -> str | None:
        """`whole` when the item's text as one string gives its status, `parts` when only its
        parts found in one document do, None for a clean item."""
        if status == "clean":
            return None
        return "whole" if self.status(whole_coverage, **thresholds) == status else "parts"

    def matches(self, text: str, *, min_coverage: float) -> list[dict]:
        """Items of which this one text holds at least `min_coverage` of the characters."""
        hits, _ = self.scan_texts([text])
        held = self.resolve(hits)
        if not len(held.items):
            return []
        found = np.zeros(len(self.pair_entry), dtype=bool)
        found[held.pairs] = True
        cov, _ = self.item_coverage(found, held.items)
        out = [
            {
                "benchmark": self.benchmarks[item],
                "item_id": self.item_ids[item],
                "coverage": round(float(share), 4),
            }
            for item, share in zip(held.items.tolist(), cov.tolist(), strict=True)
            if share >= min_coverage and share > 0
        ]
        return sorted(out, key=lambda m: -m["coverage"])

    def spans(self, text: str, items: set[int]) -> list[tuple[int, int]]:
        """Character spans of `text` (original positions) covered by units of `items`."""
        text = nfc(text)
        chars, keep, cps = fold_with_codepoints(text)
        hits = self.scan_folded(chars, np.array([0, len(chars)]), Segments(keep, cps))
        if not len(hits.units):
            return []
        wanted_items = np.fromiter(items, dtype=np.int64, count=len(items))
        wanted = np.array(
            [np.isin(self.entry_item[self.pair_entry[self.unit_pairs[self.unit_ptr[u]:self.unit_ptr[u + 1]]]],
                     wanted_items).any() for u in hits.units.tolist()], dtype=bool)  # fmt: skip
        original = np.flatnonzero(keep)
        spans = []
        for pos, unit in zip(hits.positions[wanted], hits.units[wanted], strict=True):
            # All occurrences of the unit, not only the first one.
            spans.extend(_occurrences(chars, int(pos), int(self.unit_lengths[unit])))
        return [(int(original[s]), int(original[e - 1]) + 1) for s, e in spans]

    def __len__(self) -> int:
        return len(self.item_ids)


def _occurrences(chars: np.ndarray, pos: int, length: int) -> list[tuple[int, int]]:
    needle = chars[pos : pos + length].tobytes()
    hay = chars.tobytes()
    out, start = [], 0
    while (found := hay.find(needle, start)) != -1:
        if found % 4 == 0:
            out.append((found // 4, found // 4 + length))
        start = found + 4
    return out


def _safe_cut(text: str, at: int, hard: np.ndarray) -> bool:
    """A space after a hard character (see BenchmarkIndex._scan_long)."""
    return text[at] == " " and bool(hard[ord(text[at - 1])])


def _cut_before(text: str, limit: int, hard: np.ndarray) -> int:
    """The last place in the second half of text[.. limit] to end a long text's stretch at:
    a space after a hard character, else a space, else `limit`."""
    lo = limit - LONG_TEXT_CHARS // 2
    at = text.rfind(" ", lo, limit + 1)
    while at > lo and not _safe_cut(text, at, hard):
        at = text.rfind(" ", lo, at)
    if at > lo:
        return at
    at = text.rfind(" ", lo, limit + 1)
    return at if at > lo else limit


def _cut_after(text: str, start: int, margin: int, table: np.ndarray, hard: np.ndarray) -> int:
    """The first place to end a window at after `margin` folded characters from `start`: a
    space after a hard character, else a space, else right after them (or the text's end)."""
    size = 4 * margin
    while True:
        cps = np.frombuffer(text[start : start + size].encode("utf-32-le"), dtype=np.uint32)
        kept = np.flatnonzero(gather(table, cps))
        if len(kept) >= margin or start + size >= len(text):
            break
        size *= 2
    if len(kept) < margin:
        return len(text)
    first = start + int(kept[margin - 1]) + 1
    at = text.find(" ", first, first + LONG_TEXT_CHARS // 2)
    while at != -1 and not _safe_cut(text, at, hard):
        at = text.find(" ", at + 1, first + LONG_TEXT_CHARS // 2)
    if at == -1:  # no space for half a window: end right there
        return min(first, len(text))
    return at


def _grid(starts: np.ndarray, ends: np.ndarray, n: int, stride: int) -> np.ndarray:
    """Window starts every `stride` characters from each document's start, windows inside it."""
    count = np.maximum(0, (ends - starts - n + stride) // stride)
    total = int(count.sum())
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(starts, count) + offsets * stride


def batches(texts: Iterable[str], batch_chars: int = SCAN_CHARS):
    """(offset of the first text, texts) in groups of about `batch_chars` characters."""
    batch: list[str] = []
    size = offset = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= batch_chars:
            yield offset, batch
            offset += len(batch)
            batch, size = [], 0
    if batch:
        yield offset, batch
