"""Decontamination: find benchmark items in training data, report them, remove them.

`index` normalises and hashes (the matching rules and the choice of n are documented there),
`scan` streams training data through the index in several processes, `stage` is the
`hanlm decontam` stage and its standalone, shard and merge modes.

From Python (SFT, eval, any later training stage):

    from hanlm.data import decontam
    index = decontam.load_run_index(run_dir)          # or BenchmarkIndex.build(readers.read(...))
    for row in index.check(texts): ...                 # per item: coverage, status, documents
"""

from hanlm.data.decontam.index import DEFAULT_NGRAM, BenchmarkIndex, normalise
from hanlm.data.decontam.stage import (
    STAGE,
    load_run_index,
    merge,
    run,
    standalone,
    training_corpus_dir,
)

__all__ = [
    "DEFAULT_NGRAM",
    "STAGE",
    "BenchmarkIndex",
    "load_run_index",
    "merge",
    "normalise",
    "run",
    "standalone",
    "training_corpus_dir",
]
