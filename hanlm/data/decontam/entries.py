"""What the benchmark index holds of each item: its entries, their units, and which count.

An item gives entries: its whole text, its distinguishing parts and the prompt forms it is
scored in (`item_entries`). The entries' hashed n-grams, or the whole of an entry shorter than
n, are numbered as units (`number_units`), and (entry, unit) pairs tie the two together
(`pair_tables`), template text left out: an n-gram several benchmark items share only counts
for items that are the same passage (BoolQ's several questions on one paragraph), so a leaked
item does not make every item built from the same template partial (`_not_boilerplate`).
hanlm.data.decontam.index builds the index from these tables and scans text for it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np

from hanlm.data.decontam.folding import normalise

SAME_PASSAGE = 0.5  # items sharing this share of their n-grams are one passage, not a template
MAX_SHARING = 16  # an n-gram in more items than this is boilerplate whatever they are
MIN_PART = 4  # shorter parts (a 3-character COPA premise) are no evidence: the item is whole only

WHOLE, ALONE, WITH_OTHERS, FORM = 0, 1, 2, 3  # entry kinds: see index.BenchmarkIndex


def item_entries(items: Sequence) -> tuple[list[str], list[int], list[int]]:
    """Every text to index, with its item and kind: the whole text, the distinguishing parts
    (when there are several), the prompt forms."""
    texts, entry_item, entry_kind = [], [], []
    for i, item in enumerate(items):
        texts.append(item.overlap_text)
        entry_item.append(i)
        entry_kind.append(WHOLE)
        parts = [p for p in getattr(item, "parts", ()) if len(normalise(p)) >= MIN_PART]
        if len(parts) > 1:
            texts.extend(parts)
            entry_item.extend([i] * len(parts))
            entry_kind.extend([ALONE] * len(parts))
        forms = getattr(item, "forms", ())
        texts.extend(forms)
        entry_item.extend([i] * len(forms))
        entry_kind.extend([FORM] * len(forms))
    return texts, entry_item, entry_kind


def number_units(hashes: np.ndarray, widths: np.ndarray, starts: np.ndarray):
    """Units: distinct (hash, width), numbered in hash order so lookups are one searchsorted.
    Per row its unit; per unit its hash, width and the first row's start."""
    order = np.lexsort((widths, hashes))
    new_unit = np.ones(len(order), dtype=bool)
    new_unit[1:] = (hashes[order][1:] != hashes[order][:-1]) | (
        widths[order][1:] != widths[order][:-1]
    )
    unit_of = np.empty(len(order), dtype=np.int64)
    unit_of[order] = np.cumsum(new_unit) - 1
    unit_hashes, unit_lengths = hashes[order][new_unit], widths[order][new_unit]
    return unit_of, unit_hashes, unit_lengths, starts[order][new_unit]


def pair_tables(owners, unit_of, full_ngram, entry_item, n_texts: int, n_items: int):
    """Entry <-> unit pairs, each once, template n-grams left out; per row its pair (-1: left
    out) and per entry where its rows start."""
    n_units = max(len(full_ngram), 1)
    row_keys = owners * n_units + unit_of
    pair_keys = np.unique(row_keys)
    pair_entry, pair_unit = np.divmod(pair_keys, n_units)
    keep = _specific_pairs(entry_item[pair_entry], pair_unit, full_ngram, n_items,
                           len(full_ngram))  # fmt: skip
    new_index = np.cumsum(keep) - 1
    row_pair = np.searchsorted(pair_keys, row_keys)
    pos_pair = np.where(keep[row_pair], new_index[row_pair], -1)
    pos_ptr = np.concatenate([[0], np.cumsum(np.bincount(owners, minlength=n_texts))])
    return pair_entry[keep], pair_unit[keep], pos_ptr, pos_pair


def _specific_pairs(pair_items, pair_units, is_ngram, n_items: int, n_units: int) -> np.ndarray:
    """Which (entry, unit) pairs count: `_not_boilerplate` decided per item over the n-gram
    units of all its entries (a short unit is a whole part or stem: it is never template text,
    and a short part counts only beside the item's other parts anyway)."""
    keep = np.ones(len(pair_items), dtype=bool)
    ngram = is_ngram[pair_units]
    if not ngram.any():
        return keep
    keys = np.unique(pair_items[ngram] * n_units + pair_units[ngram])
    items, units = np.divmod(keys, n_units)
    specific = _not_boilerplate(items, units, n_items, n_units)
    where = np.searchsorted(keys, pair_items[ngram] * n_units + pair_units[ngram])
    keep[ngram] = specific[where]
    return keep


def _not_boilerplate(pair_items, pair_units, n_items: int, n_units: int) -> np.ndarray:
    """Which (item, unit) pairs count toward coverage.

    Benchmarks built from templates (the demo world, instruction sets) repeat sentences across
    many items; finding such a sentence says nothing about which item leaked, so it must not
    make every item of the template partial. But several BoolQ questions on one passage share
    that passage, and a leaked passage leaks all of them. So an n-gram shared by items counts
    for an item only when one of the others sharing it is the same passage (they share at least
    SAME_PASSAGE of the smaller one's n-grams), and an item made of nothing else keeps all.
    """
    per_unit = np.bincount(pair_units, minlength=n_units)
    shared = per_unit[pair_units] > 1
    keep = ~shared
    if not shared.any():
        return keep
    sizes = np.bincount(pair_items, minlength=n_items)
    order = np.argsort(pair_units, kind="stable")
    rows = np.flatnonzero(shared[order] & (per_unit[pair_units[order]] <= MAX_SHARING))
    groups: dict[int, list[int]] = {}
    for row in order[rows].tolist():
        groups.setdefault(int(pair_units[row]), []).append(row)
    overlap: Counter = Counter()
    for rows_of_unit in groups.values():
        owners = sorted(int(pair_items[r]) for r in rows_of_unit)
        overlap.update(itertools.combinations(owners, 2))
    same = {
        pair
        for pair, count in overlap.items()
        if count >= SAME_PASSAGE * min(sizes[pair[0]], sizes[pair[1]])
    }
    for rows_of_unit in groups.values():
        owners = [int(pair_items[r]) for r in rows_of_unit]
        for row, item in zip(rows_of_unit, owners, strict=True):
            keep[row] = any((min(item, o), max(item, o)) in same for o in owners if o != item)
    specific = np.bincount(pair_items[keep], minlength=n_items) > 0
    return keep | ~specific[pair_items]
