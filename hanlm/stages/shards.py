"""The shards stage: the training corpus tokenised into `RUN/shards/` (see hanlm.data.shards).

The encoding runs on the data engine in `RUN/shards.work/`, kept while the settings and inputs
stay the same: a run killed part-way resumes there, encoding only the parts whose task had not
finished. Bad input (a UserError) throws the work away, since the input must change first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.data import shards
from hanlm.errors import UserError
from hanlm.files import (
    file_sha256,
    fingerprint,
    read_json,
    stage_fingerprint,
)
from hanlm.stages import engine_output
from hanlm.stages import tokenizer as tokenizer_stage
from hanlm.stages.corpus import checked_corpus, training_corpus_dir
from hanlm.stages.rundir import RunDir, finished_output

STAGE = "shards"
LEGACY_WORK_MARKER = "work.json"  # the work folder of hanlm before the data engine


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
    # how the encoding is batched changes no token (see data.shards._encoded)
    output_settings = cfg.shards.model_dump(exclude={"batch_docs", "piece_chars"})
    sha = file_sha256(run.tokenizer_json)
    return fingerprint(STAGE, output_settings, cfg.run.seed, sha, upstream)


def _remove_legacy_work(run: RunDir) -> None:
    """An interrupted run of hanlm before the data engine left its work in shards.incomplete/
    (recognised by its work.json): hanlm's own leftover, encoded again from the start."""
    legacy = run.shards.with_name(f"{run.shards.name}.incomplete")
    if (legacy / LEGACY_WORK_MARKER).is_file():
        info(f"shards: {legacy} is an earlier hanlm's unfinished work; encoding from the start")
        shutil.rmtree(legacy)


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict | None:
    """The shards' manifest; None when the tasks were submitted to a cluster and still run."""
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
                engine_output.remove_leftover_work(STAGE, run.shards_work)
                return read_json(run.shards_manifest)
            warn(f"shards: {out} is damaged ({'; '.join(problems[:3])}); encoding again")
        else:
            _check_existing(run, sha)

    corpus_dir = checked_corpus(run, training_corpus_dir(run))
    _remove_legacy_work(run)
    work = engine_output.work_folder(run.shards_work, fp, force=force)
    manifest = engine_output.build(
        STAGE,
        out,
        work,
        fp,
        lambda tmp: shards.encode_corpus(
            corpus_dir, tokenizer_json, sha, cfg.shards, cfg.run.seed, cfg.data_engine, work, tmp
        ),
        what="shards",
    )
    if manifest is None:
        return None
    tr = manifest["splits"]["train"]
    info(
        f"shards: {tr['tokens']:,} train tokens in {tr['documents']:,} documents, "
        f"{manifest['splits']['val']['tokens']:,} val tokens ({manifest['dtype']}) -> {out}"
    )
    return manifest


def check_intact(run: RunDir | Path) -> None:
    """Before training reads them: the token files match the sizes and sha256 recorded when
    they were written (a flipped token id would otherwise surface as an index error deep in
    the model); a UserError naming the damage and the rebuild otherwise."""
    run = RunDir.of(run)
    problems = shards.damaged_outputs(run.shards)
    if problems:
        raise UserError(
            f"the shards in {run.shards} are damaged ({'; '.join(problems[:3])})",
            fix=f"make them again: `hanlm run --run {run.root}` checks every finished stage and "
            f"redoes the damaged ones, or `hanlm shards --run {run.root} --force`",
        )


def load_manifest(run: RunDir | Path) -> dict:
    """The run's shard manifest, checked against the run's tokenizer."""
    run = RunDir.of(run)
    path = finished_output(run.shards_manifest, "shards", f"run `hanlm shards --run {run.root}`")
    manifest = read_json(path)
    _check_existing(run, file_sha256(run.tokenizer_json))
    return manifest
