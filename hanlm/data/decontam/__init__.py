"""Decontamination: find benchmark items in training data, report them, remove them.

`index` normalises and hashes (the matching rules and the choice of n are documented there),
`scan` streams training data through the index as tasks of the data engine (hanlm.data.engine),
`outputs` turns a scan into the reports and the cleaned corpus (its rewritten parts: tasks too).
The `hanlm decontam` stage and its standalone, shard and merge modes are in hanlm.stages.decontam.

From Python (SFT, eval, any later training stage), with an index a decontam folder saved
(a run's: `load_run_index` of the decontam stage) or one built from benchmark items:

    index = BenchmarkIndex.build(items)                # or BenchmarkIndex.load(path)
    for row in index.check(texts): ...                 # per item: coverage, status, documents
"""

from hanlm.data.decontam.index import DEFAULT_NGRAM, BenchmarkIndex, normalise

__all__ = ["DEFAULT_NGRAM", "BenchmarkIndex", "normalise"]
