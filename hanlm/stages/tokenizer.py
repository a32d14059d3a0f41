"""The tokenizer stage: a BPE tokenizer trained on the run's training corpus into
`RUN/tokenizer/` (see hanlm.data.tokenizer)."""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.data import tokenizer
from hanlm.files import (
    atomic_output_dir,
    fingerprint,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.stages.corpus import checked_corpus, training_corpus_dir
from hanlm.stages.rundir import RunDir, finished_output

STAGE = "tokenizer"


def stage_fp(cfg: Config, run: RunDir | Path) -> str:
    corpus_dir = training_corpus_dir(run)
    upstream = stage_fingerprint(corpus_dir) or stage_fingerprint(corpus_dir.parent)
    return fingerprint(STAGE, cfg.tokenizer.model_dump(), cfg.run.seed, upstream)


def finished_path(run: RunDir | Path) -> Path:
    """The run's tokenizer.json; a UserError when the tokenizer stage has not finished."""
    run = RunDir.of(run)
    fix = f"run `hanlm tokenizer --run {run.root}` first"
    return finished_output(run.tokenizer_json, "tokenizer", fix)


def load(run: RunDir | Path):
    """The run's trained tokenizer as a `tokenizers.Tokenizer`."""
    return tokenizer.load(finished_path(run))


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict:
    run = RunDir.of(run)
    out = run.tokenizer
    fp = stage_fp(cfg, run)
    if not force and stage_fingerprint(out) == fp:
        problem = tokenizer.damage(out)
        if problem is None:
            info(f"tokenizer: up to date in {out}, skipped")
            return read_json(out / tokenizer.STATS_FILE)
        warn(f"tokenizer: {out} is damaged ({problem}); training it again")
    corpus_dir = checked_corpus(run, training_corpus_dir(run))
    with atomic_output_dir(out) as tmp:
        stats = tokenizer.build(corpus_dir, cfg, tmp)
        write_stage_marker(tmp, STAGE, fp)
    h = stats["heldout"]
    info(
        f"tokenizer: {stats['vocab_size']:,} tokens; held-out {h['chars_per_token']} chars/token, "
        f"{h['bytes_per_token']} bytes/token -> {out}"
    )
    return stats
