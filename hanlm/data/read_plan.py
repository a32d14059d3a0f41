"""How far the corpus stage reads each source: as far as the mix needs.

A source whose share of the training tokens needs far less text than it holds (FineWeb-2's
Korean subset holds ~260 GB; a 1.3B model's 21 B tokens need about half of it, a 350M model's
7 B a sixth) is read only that far: its share in one pass, times `corpus.read_margin` for what
cleaning, deduplication and decontamination remove, at `corpus.chars_per_token`. What is read is
whole tasks (row groups of parquet files, byte ranges of line files, whole other files) drawn in
an order seeded by the run's seed and the source's name, so the sample is spread over every file
of the dataset, not its first one; a larger budget draws further along the same order, so it
reads a superset. The same settings read the same documents.

The characters a task holds are told from its bytes at the source's own bytes per character,
measured on the first task drawn (read whole: it is always read anyway).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from pathlib import Path

from hanlm.config import Config, CorpusSection, CorpusSourceSection
from hanlm.data import readers
from hanlm.data.corpus import SourceRead
from hanlm.data.mixture import token_shares
from hanlm.data.readers import Skips, Unit


def needed_characters(cfg: Config) -> dict[str, int | None]:
    """Characters of raw text each source is to be read for (None: all of it): computed from
    the whole recipe (the training budget is pretraining's), and part of the corpus stage's
    fingerprint, so a larger budget makes the stage read more."""
    corpus = cfg.corpus
    sources = corpus.source_list()
    steps = cfg.pretrain.steps()
    shares = (
        token_shares(sources, steps * cfg.pretrain.global_batch_tokens)
        if corpus.is_mixture and steps is not None
        else {}
    )
    needs: dict[str, int | None] = {}
    for source in sources:
        demo = any(map(readers.is_demo, source.inputs))
        if source.read == "all" or demo or (source.read == "needed" and not source.mixed):
            needs[source.name] = None
            continue
        tokens = source.read if isinstance(source.read, int) else shares.get(source.name)
        needs[source.name] = (
            None
            if tokens is None
            else math.ceil(tokens * corpus.chars_per_token * corpus.read_margin)
        )
    return needs


def why(source: CorpusSourceSection, needed: int | None, corpus: CorpusSection) -> str:
    if needed is None:
        if source.read == "all":
            reason = 'read = "all"'
        elif any(map(readers.is_demo, source.inputs)):
            reason = "the demo world, made to demo.size_mb"
        else:
            reason = "no share of a training budget to size it"
        return f"read whole: {reason}"
    read = source.read
    tokens = f"{read:,} tokens (read = N)" if isinstance(read, int) else "its share"
    return (
        f"{tokens} x {corpus.chars_per_token:g} chars/token (corpus.chars_per_token) x "
        f"{corpus.read_margin:g} (corpus.read_margin) = {needed:,} characters"
    )


def select(
    units: list[Unit],
    needs: dict[str, int | None],
    corpus: CorpusSection,
    seed: int,
    *,
    demo_file: Path | None = None,
) -> tuple[list[Unit], dict[str, SourceRead]]:
    """The units to read, in their original order (deduplication keeps a cluster's earliest
    document), and what each source read and why."""
    by_source: dict[str, list[Unit]] = defaultdict(list)
    for unit in units:
        by_source[unit.corpus_source].append(unit)
    specs = {s.name: s for s in corpus.source_list()}
    chosen: set[int] = set()
    reads: dict[str, SourceRead] = {}
    index = {id(u): i for i, u in enumerate(units)}
    for name, own in by_source.items():
        need = needs.get(name)
        total = sum(u.nbytes for u in own)
        order = list(own)
        taken, per_char = own, None
        if need is not None and len(own) > 1 and total > 0:
            random.Random(f"{seed}:{name}").shuffle(order)
            per_char = _bytes_per_character(order[0], corpus, demo_file)
            want = need * per_char
            taken, size = [], 0
            for unit in order:
                if size >= want:
                    break
                taken.append(unit)
                size += unit.nbytes
        chosen.update(index[id(u)] for u in taken)
        read_bytes = sum(u.nbytes for u in taken)
        reads[name] = SourceRead(
            asked=specs[name].read,
            needed_characters=need,
            why=why(specs[name], need, corpus),
            tasks_read=len(taken),
            tasks=len(own),
            bytes_read=read_bytes,
            bytes=total,
            bytes_per_character=round(per_char, 4) if per_char is not None else None,
            whole=len(taken) == len(own),
        )
    return [u for i, u in enumerate(units) if i in chosen], reads


def _bytes_per_character(unit: Unit, corpus: CorpusSection, demo_file: Path | None) -> float:
    """The unit's bytes (as its size counts them: on disk, or a parquet column's) per character
    of text, from reading it whole."""
    chars = sum(len(d.text) for d in unit.documents(corpus, Skips(strict=False), demo_file))
    return unit.nbytes / chars if chars else 1.0
