"""Decontamination: find benchmark items in training data, report them, remove them.

`folding` normalises text (the matching rules), `hashing` hashes its character n-grams and
tests them against a set, `entries` decides what of each benchmark item is indexed and which
n-grams count, `index` builds the benchmark index and scans text for it (the choice of n is
documented there), `scan` streams training data through the index as tasks of the data engine
(hanlm.data.engine), `outputs` turns a scan into the reports and the cleaned corpus (its
rewritten parts: tasks too).
The `hanlm decontam` stage and its standalone, shard and merge modes are in hanlm.stages.decontam.

From Python (SFT, eval, any later training stage), with an index a decontam folder saved
(a run's: `load_run_index` of the decontam stage) or one built from benchmark items:

    index = BenchmarkIndex.build(items)                # or BenchmarkIndex.load(path)
    for row in index.check(texts): ...                 # per item: coverage, status, documents
"""

from hanlm.data.decontam.folding import normalise
from hanlm.data.decontam.index import DEFAULT_NGRAM, BenchmarkIndex

__all__ = ["DEFAULT_NGRAM", "BenchmarkIndex", "normalise"]
