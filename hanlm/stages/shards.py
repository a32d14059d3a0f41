"""The shards stage: the training corpus tokenised into `RUN/shards/` (see hanlm.data.shards)."""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.data import shards
from hanlm.errors import UserError
from hanlm.files import (
    file_sha256,
    fingerprint,
    read_json,
    replace_dir,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.stages import tokenizer as tokenizer_stage
from hanlm.stages.corpus import training_corpus_dir
from hanlm.stages.rundir import RunDir, finished_output

STAGE = "shards"


def _check_existing(run: RunDir, sha: str) -> None:
    """Shards made with another tokenizer than the run's are refused, naming the rebuild."""
    out = run.shards
    made_with = shards.made_with_tokenizer(out)
    if made_with is not None and made_with != sha:
        raise UserError(
            f"the shards in {out} were made with another tokenizer (sha256 {made_with[:12]}…) "
            f"than the run's ({sha[:12]}…)",
            fix=f"rebuild them with `hanlm shards --run {run.root} --force` "
            "(or `hanlm run --from tokenizer`)",
        )


def stage_fp(cfg: Config, run: RunDir | Path) -> str:
    run = RunDir.of(run)
    corpus_dir = training_corpus_dir(run)
    upstream = stage_fingerprint(corpus_dir) or stage_fingerprint(corpus_dir.parent)
    output_settings = cfg.shards.model_dump(exclude={"workers", "batch_docs"})
    sha = file_sha256(run.tokenizer_json)
    return fingerprint(STAGE, output_settings, cfg.run.seed, sha, upstream)


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict:
    run = RunDir.of(run)
    out = run.shards
    tokenizer_json = tokenizer_stage.finished_path(run)
    sha = file_sha256(tokenizer_json)
    fp = stage_fp(cfg, run)
    if not force:
        if stage_fingerprint(out) == fp:
            problems = shards.damaged_outputs(out)
            if not problems:
                info(f"shards: up to date in {out}, skipped")
                return read_json(run.shards_manifest)
            warn(f"shards: {out} is damaged ({'; '.join(problems[:3])}); encoding again")
        else:
            _check_existing(run, sha)

    corpus_dir = training_corpus_dir(run)
    work = run.shards_incomplete
    manifest = shards.encode_corpus(
        corpus_dir, tokenizer_json, sha, cfg.shards, cfg.run.seed, work, fp
    )
    write_stage_marker(work, STAGE, fp)
    replace_dir(out, work)
    tr = manifest["splits"]["train"]
    info(
        f"shards: {tr['tokens']:,} train tokens in {tr['documents']:,} documents, "
        f"{manifest['splits']['val']['tokens']:,} val tokens ({manifest['dtype']}) -> {out}"
    )
    return manifest


def load_manifest(run: RunDir | Path) -> dict:
    """The run's shard manifest, checked against the run's tokenizer."""
    run = RunDir.of(run)
    path = finished_output(run.shards_manifest, "shards", f"run `hanlm shards --run {run.root}`")
    manifest = read_json(path)
    _check_existing(run, file_sha256(run.tokenizer_json))
    return manifest
