"""What a run reads from outside its folder, checked before its first stage writes anything.

A missing benchmark file used to be found after the corpus stage, a missing chat data file after
pretraining: hours in. `hanlm run` now checks every input of the stages it will run (between
`--from` and `--until`) first, and fails in seconds with one error listing every problem:

- corpus: each input of each source: a glob that matches files (each one opens: a JSONL's first
  record, a parquet footer with the text column), a local snapshot folder whose config and
  split resolve, a Hub id that resolves online (offline: it cannot be streamed);
- decontam: each benchmark file (the demo world's is the run's own);
- eval: each task (known to hanlm, a task file or lm-evaluation-harness's registry) and its
  data file;
- sft: each chat data source's inputs (they resolve, and the first row is a conversation in
  the source's format) and `sft.model`;
- pretraining with distillation: the teacher model;
- training (pretrain, sft, compare): the device, parallel mode and precision this host gives
  (FP8 needs a GPU of compute capability 8.9+; `single` cannot run under torchrun).

Each check is the one the stage itself makes, called early; nothing is read whole here.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from hanlm.config import Config, SourceFields
from hanlm.data import dataset_repo, readers
from hanlm.errors import UserError
from hanlm.model_folder import check_model_folder

TRAINING_STAGES = {"pretrain", "sft", "compare"}  # they place a model on this host's devices


def problems(cfg: Config, stages: Iterable[str]) -> list[str]:
    """Every input problem of `stages`, one line each (empty: all there)."""
    stages = set(stages)
    found: list[str] = []

    def check(what: str, probe: Callable[[], object]) -> None:
        try:
            probe()
        except UserError as e:
            found.append(f"{what}: {e.message}")

    if "corpus" in stages:
        if cfg.corpus.url_blocklist and not Path(cfg.corpus.url_blocklist).expanduser().is_file():
            found.append(f"corpus.url_blocklist {cfg.corpus.url_blocklist!r}: no such file")
        for source in cfg.corpus.source_list():
            fields = cfg.corpus.fields_of(source)  # as the corpus stage reads it
            for spec in source.inputs:
                check(f"corpus source {source.name!r} input {spec!r}",
                      lambda spec=spec, fields=fields: _corpus_input(spec, fields))  # fmt: skip
    if "decontam" in stages:
        for spec in cfg.decontam.benchmarks:
            check(f"decontam.benchmarks {spec!r}", lambda spec=spec: _benchmark(spec))
    if "eval" in stages:
        for spec in cfg.eval.tasks:
            check(f"eval.tasks {spec!r}", lambda spec=spec: _eval_task(spec))
    if "sft" in stages:
        for source in cfg.sft.source_list():
            for spec in source.inputs:
                check(f"sft source {source.name!r} input {spec!r}",
                      lambda spec=spec, source=source: _chat_input(spec, source))  # fmt: skip
        if cfg.sft.model:
            check(f"sft.model {cfg.sft.model!r}", lambda: _model(cfg.sft.model))
    if "pretrain" in stages and cfg.distill.enabled and cfg.distill.teacher:
        check(f"distill.teacher {cfg.distill.teacher!r}", lambda: _model(cfg.distill.teacher))
    if stages & TRAINING_STAGES:
        check(f"precision.mode {cfg.precision.mode!r} and parallel.mode {cfg.parallel.mode!r} "
              "on this host", lambda: _training_placement(cfg))  # fmt: skip
    return found


def check(cfg: Config, stages: Iterable[str]) -> None:
    """One UserError listing every missing or unreadable input of `stages`, and what this host
    cannot run of them."""
    found = problems(cfg, stages)
    if found:
        raise UserError(
            f"{len(found)} input(s) or setting(s) of this run cannot be used here; nothing was "
            "written:\n  - " + "\n  - ".join(found),
            fix="fix each one (or its key in the recipe) and run the same command again",
        )


def _corpus_input(spec: str, fields: SourceFields) -> None:
    """The input resolves and each of its local files (a Hub split's first) opens with a first
    record that the corpus stage reads by the source's `fields` (hanlm.data.readers.probe)."""
    if readers.is_demo(spec):
        readers.demo_kinds(spec)
        return
    if dataset_repo.is_hf_id(spec) and dataset_repo.snapshot_folder(spec) is None:
        _hub_dataset(spec)  # offline: how to download it; online: it resolves
    files = readers.expand_inputs([spec])  # no match, an unsupported type: its UserError
    local = [f for f in files if isinstance(f, Path)]
    hub = [f for f in files if dataset_repo.is_hub_file(f)]
    for source in [*local, *hub[:1]]:  # a Hub file's footer is read over the network
        readers.probe(source, fields)


def _training_placement(cfg: Config) -> None:
    """The device, parallel mode and precision training will resolve here (an FP8 recipe on a
    machine without FP8 used to stop at pretraining, after the data stages)."""
    from hanlm.train import parallel, precision  # deferred: torch

    device, _ = parallel.planned_placement(cfg.parallel.device, cfg.parallel.mode)
    precision.resolve(cfg.precision.mode, device, recipe=cfg.precision.fp8_recipe)


def _hub_dataset(spec: str) -> None:
    """A Hub dataset id resolves (online), or says how to get it (offline)."""
    repo, revision = dataset_repo.hub_name_and_revision(dataset_repo.parse_hf(spec)[0])
    if dataset_repo.hf_offline():
        raise UserError(
            f"{spec} cannot be streamed: Hugging Face is set offline",
            fix=dataset_repo.hf_download_fix(spec),
        )
    from huggingface_hub import HfApi  # deferred: the network

    try:
        HfApi().dataset_info(repo, revision=revision, timeout=30)
    except Exception as e:  # not found, gated, no network: each needs the user
        raise UserError(
            f"{spec} does not resolve on the Hub ({type(e).__name__}: {e})",
            fix=dataset_repo.hf_download_fix(spec),
        ) from None


def _benchmark(spec: str) -> None:
    from hanlm.stages.decontam import benchmark_specs  # deferred: the stage's own resolution

    if spec.partition("=")[2].strip() == "demo":
        return  # the demo world's benchmark: the run makes it
    benchmark_specs([spec], None)


def _eval_task(spec: str) -> None:
    from hanlm.evals import tasks as tasks_lib  # deferred: lm-eval's registry, when named

    for leaf in tasks_lib.expand_specs([spec])[0]:
        name, source = tasks_lib.parse_task_spec(leaf)
        tasks_lib.get(name)
        if source and dataset_repo.is_hf_id(source):
            _hf_split(source)
        elif source and source != "demo":
            matches = glob.glob(os.path.expanduser(source))
            if not matches:
                raise UserError(f"the data of task {name} is not at {source}")


def _hf_split(spec: str) -> None:
    """A dataset id read whole (a benchmark): a snapshot's split resolves to files; a Hub id
    resolves online (offline, `datasets` may hold it in its cache: the stage will say)."""
    if dataset_repo.snapshot_folder(spec) is not None:
        dataset_repo.snapshot_files(spec)
    elif not dataset_repo.hf_offline():
        _hub_dataset(spec)
    else:
        dataset_repo.parse_hf(spec)


def _chat_input(spec: str, source) -> None:
    """A chat data input resolves (files, a snapshot's split, a Hub id online) and its first
    row is a conversation in the source's format (the rest is read, and counted, by SFT)."""
    from hanlm.data import chat_sources  # deferred: the SFT stage's reader

    if dataset_repo.is_hf_id(spec) and dataset_repo.snapshot_folder(spec) is None:
        _hf_split(spec)
        return
    first = next(iter(chat_sources.rows(spec)), None)
    if first is None:
        raise UserError(f"{spec} holds no rows")
    where, _, row = first
    fmt = source.format if source.format != "auto" else chat_sources.detect(row)
    if isinstance(row, chat_sources.BadRow) or fmt is None:
        detail = row.detail if isinstance(row, chat_sources.BadRow) else "no known format"
        raise UserError(f"its first row cannot be read ({detail})", where=where)
    keys = {**chat_sources.FORMAT_KEYS[fmt], **source.fields}
    try:
        chat_sources.to_messages(row, fmt, keys)
    except chat_sources.BadRow as e:
        what = f"its first row is not a {fmt} conversation ({e.detail})"
        raise UserError(what, where=where) from None


def _model(spec: str) -> None:
    check_model_folder(spec)
