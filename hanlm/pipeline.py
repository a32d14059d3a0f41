"""The stages in order, and the one place that runs a stage: its fingerprint from what it
declares (hanlm.stages.stage), skip-if-complete, the atomic output and its marker, the ranks
that run it under torchrun, and `--from STAGE` / `--until STAGE`.
"""

from __future__ import annotations

import datetime
import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from hanlm import __version__, ranks, remote_code, run_inputs, run_lock
from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.files import STAGE_MARKER, atomic_output_dir, fingerprint
from hanlm.stages import data_jobs
from hanlm.stages.markers import read_stage_marker, stage_fingerprint, write_stage_marker
from hanlm.stages.rundir import RunDir, save_run_config
from hanlm.stages.stage import (
    NotNeeded,
    OnRankZero,
    Rerun,
    Stage,
    StageContext,
    StageOutcome,
    Unfinished,
    declared_settings,
    declared_view,
    earlier_layout,
)
from hanlm.train import trackers

# name -> the module declaring it (STAGE) and building its output (build), in the run's order
STAGES: dict[str, str] = {
    "plan": "hanlm.stages.plan",
    "preflight": "hanlm.stages.preflight",
    "corpus": "hanlm.stages.corpus",
    "decontam": "hanlm.stages.decontam",
    "tokenizer": "hanlm.stages.tokenizer",
    "shards": "hanlm.stages.shards",
    "pretrain": "hanlm.stages.pretrain",
    "export": "hanlm.stages.export",
    "sft": "hanlm.stages.sft",
    "eval": "hanlm.stages.eval",
    "compare": "hanlm.stages.compare",
    "report": "hanlm.stages.report",
}
# made on demand for the stages that read the demo world (Stage.uses_demo), not in the order
DEMO = "hanlm.stages.demo"
WAIT_LIMIT = datetime.timedelta(days=7)  # a corpus stage on a large crawl takes hours


def stage_module(name: str) -> ModuleType:
    if name == "demo":
        return importlib.import_module(DEMO)
    if name not in STAGES:
        raise UserError(f"unknown stage {name!r}", fix=f"choose one of {', '.join(STAGES)}")
    return importlib.import_module(STAGES[name])


def declaration(name: str) -> Stage:
    """Stage `name`'s declaration: its module's STAGE, checked to be one, and of that name."""
    stage = getattr(stage_module(name), "STAGE", None)
    if not isinstance(stage, Stage) or stage.name != name:
        raise TypeError(f"{STAGES.get(name, DEMO)} must end with STAGE = Stage(name={name!r}, ...)")
    return stage


# --- fingerprints ----------------------------------------------------------------------------


def finished_fingerprint(name: str, run: RunDir) -> str | None:
    """The fingerprint stage `name` finished with in `run`, or None."""
    return stage_fingerprint(declaration(name).output(run))


def stage_options(stage: Stage, given: dict[str, Any] | None = None) -> Any:
    """The command's own settings for `stage`, as the dataclass it declares."""
    try:
        return stage.options(**(given or {}))
    except TypeError as e:  # a caller's mistake, not the user's
        raise TypeError(f"stage {stage.name} takes no such option: {e}") from None


def upstream_of(stage: Stage, cfg: Config, options: Any = None) -> tuple[str, ...]:
    """The stages whose outputs `stage` reads for `cfg` (whole or its declared view): its
    declared ones, and the demo world when it reads it."""
    options = stage_options(stage) if options is None else options
    uses_demo = stage.uses_demo(declared_view(cfg, stage), options)
    return (*stage.after, *(("demo",) if uses_demo else ()))


def fingerprint_of(stage: Stage, cfg: Config, upstream: dict[str, str | None], inputs: Any) -> str:
    """What a finished output is recognised by: the stage and its version, exactly the settings
    it declares (and what it derives from the rest: Stage.derived), the fingerprints of the
    outputs it reads, and its inputs from outside the run."""
    settings = declared_settings(cfg, stage)
    if stage.derived is not None:
        settings = {**settings, "derived": stage.derived(cfg)}
    return fingerprint(stage.name, stage.version, settings, upstream, inputs)


def current_fingerprint(name: str, cfg: Config, run: RunDir, **options: Any) -> str:
    """The fingerprint stage `name` would finish with now in `run`."""
    stage = declaration(name)
    return _fingerprint(stage, cfg, declared_view(cfg, stage), run, stage_options(stage, options))


def _fingerprint(stage: Stage, cfg: Config, view: Config, run: RunDir, options: Any) -> str:
    upstream = {u: finished_fingerprint(u, run) for u in upstream_of(stage, view, options)}
    return fingerprint_of(stage, cfg, upstream, stage.inputs(view, run, options))


# --- running one stage -----------------------------------------------------------------------


def _remove_work(stage: Stage, run: RunDir) -> None:
    """A finished stage has no use for the work folder its jobs resumed in."""
    work = stage.work(run) if stage.work is not None else None
    if work is not None and work.is_dir():
        shutil.rmtree(work)


class _NotFinished(Exception):
    """build returned None or Unfinished: no marker."""

    def __init__(self, result: StageOutcome):
        self.result = result


def _unfinished(result: Any) -> bool:
    return result is None or isinstance(result, Unfinished)


def _checked(stage: Stage, result: Any) -> StageOutcome:
    """build's result, once it is of the type the stage declares (or Unfinished / None)."""
    if stage.result is None or _unfinished(result) or isinstance(result, stage.result):
        if isinstance(result, Unfinished) and stage.result is not None:
            _checked(stage, result.summary)
        return result
    raise TypeError(
        f"stage {stage.name}'s build returned {type(result).__name__}, not the "
        f"{stage.result.__name__} its Stage(result=...) declares"
    )


def _summary(result: Any) -> StageOutcome:
    return result.summary if isinstance(result, Unfinished) else result


def _write_marker(folder: Path, stage: Stage, fp: str) -> None:
    write_stage_marker(folder, stage.name, fp, version=stage.version, hanlm=__version__)


def _reusable(stage: Stage, run: RunDir, out: Path, fp: str) -> StageOutcome:
    """The finished result to return instead of building, or None to build. A folder made by
    another version of the stage is refused: it is never reused, nor replaced unasked."""
    marker = read_stage_marker(out)
    if marker is None:
        return None
    if marker.get("version") != stage.version or marker.get("stage") != stage.name:
        raise earlier_layout(stage, out, marker, run)
    if marker["fingerprint"] != fp:
        return None
    problem = stage.damage(run)
    if problem is not None:
        warn(f"{stage.name}: {out} is damaged ({problem}); making it again")
        return None
    if stage.name in STAGES:  # the demo world, made on demand, is reused without a word
        info(f"{stage.name}: up to date in {out}, skipped")
    _remove_work(stage, run)
    if stage.result is None:
        return {}
    return stage.result.read(
        out / stage.result.FILE,
        fix=f"redo the stage with `hanlm run --run {run.root} --from {stage.name}`",
    )


def _built(stage: Stage, ctx: StageContext) -> Any:
    """stage.build(ctx), in the work folder it declares (Stage.work): made ready here, once its
    output's place is claimed (a refusal there keeps an interrupted run's work), kept between
    runs of the same settings for a killed run to resume in, thrown away on bad input."""
    if stage.work is None:
        return stage.build(ctx)
    ctx.work = data_jobs.work_folder(stage.work(ctx.run), ctx.fingerprint, force=ctx.force)
    try:
        return stage.build(ctx)
    except UserError:
        shutil.rmtree(ctx.work, ignore_errors=True)  # the input must change before a retry
        raise


def _build(stage: Stage, ctx: StageContext, out: Path) -> StageOutcome:
    if stage.writes == "new_folder":
        try:
            with atomic_output_dir(out) as tmp:
                ctx.out = tmp
                result = _checked(stage, _built(stage, ctx))
                if _unfinished(result):
                    raise _NotFinished(_summary(result))
                # once: a library whose file is also its folder's marker outside a run (eval
                # --out, export --out) has written it already; the others leave it to us
                if stage.result is not None and not (tmp / stage.result.FILE).exists():
                    result.write(tmp / stage.result.FILE)
                _write_marker(tmp, stage, ctx.fingerprint)
        except _NotFinished as stopped:
            return stopped.result
        _remove_work(stage, ctx.run)
        return result
    if ranks.is_main():  # in place: not complete from here until the marker is written again
        (out / STAGE_MARKER).unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
    result = _checked(stage, _built(stage, ctx))
    if not _unfinished(result) and ranks.is_main():
        _write_marker(out, stage, ctx.fingerprint)
    return _summary(result)


def _run(name: str, cfg: Config, run: RunDir, force: bool, options: Any) -> StageOutcome:
    stage = declaration(name)
    out = stage.output(run)
    view = declared_view(cfg, stage)
    reason = stage.not_needed(view)
    if reason is not None:
        # a finished earlier output would otherwise be read by the stages after it; a folder
        # without hanlm's marker is not hanlm's to delete (and is never read as finished)
        if read_stage_marker(out) is not None and ranks.is_main():
            shutil.rmtree(out)
        info(f"{name}: {reason}; skipped")
        return NotNeeded(name, reason)
    stage.validate(view, run, options)
    if stage.uses_demo(view, options):
        _run_on_ranks("demo", cfg, run, False, stage_options(declaration("demo")))
    if stage.rerun is not None:
        return _rerun(stage, stage.rerun, cfg, run, force)
    derived = stage.derived(cfg) if stage.derived is not None else None
    if stage.writes == "always":
        ctx = StageContext(view, run, out, "", force, options, derived)
        return _checked(stage, _built(stage, ctx))
    fp = _fingerprint(stage, cfg, view, run, options)
    if not force and not stage.always_builds(options):
        reused = _reusable(stage, run, out, fp)
        if reused is not None:
            return reused
    if stage.logs_to_trackers:
        trackers.check(view.logging)  # on every rank, before the stage loads anything
    return _build(stage, StageContext(view, run, out, fp, force, options, derived), out)


def _rerun(stage: Stage, rerun: Rerun, cfg: Config, run: RunDir, force: bool) -> dict:
    """A stage that is the pipeline again, on a derived recipe in a run folder of its own."""
    derived_cfg, sub = rerun.derive(cfg, run)
    if ranks.is_main():
        rerun.prepare(run, sub)
    info(f"{stage.name}: {rerun.describe(sub)}")
    results = {
        name: _run_on_ranks(
            name,
            derived_cfg,
            sub,
            force,
            stage_options(declaration(name)),
            key=f"{stage.name}/{name}",
        )
        for name in rerun.stages
    }
    return {"run": str(sub.root), "stages": sorted(results)}


def launch_store():
    """The key-value store torchrun's agent keeps for this launch: fresh for every launch and
    restart, so a waiting rank never mistakes an earlier run's signal for this one's."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        raise UserError(
            "hanlm run with several processes needs torchrun's agent store",
            fix="launch it with torchrun (e.g. torchrun --nproc_per_node 8 -m hanlm run "
            "--run-dir DIR), or run the stages one by one",
        )
    from torch.distributed import PrefixStore, TCPStore  # deferred: torch, only under torchrun

    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=WAIT_LIMIT,
    )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"hanlm-pipeline/{restart}", store)


def _run_on_ranks(
    name: str, cfg: Config, run: RunDir, force: bool, options: Any, *, key: str | None = None
) -> StageOutcome:
    """Run a stage on every rank if it declares so, else on rank 0 alone while the others wait
    on `key` (default: the stage's name; a launch that runs a stage twice names each run)."""
    with remote_code.trusting(cfg.model.trust_remote_code):
        return _run_here_or_on_rank_zero(name, cfg, run, force, options, key or name)


def _run_here_or_on_rank_zero(
    name: str, cfg: Config, run: RunDir, force: bool, options: Any, key: str
) -> StageOutcome:
    if ranks.world_size() <= 1 or declaration(name).all_ranks:
        return _run(name, cfg, run, force, options)
    store = launch_store()
    if ranks.is_main():
        try:
            result = _run(name, cfg, run, force, options)
        except BaseException as e:
            store.set(key, f"failed: {e}")
            raise
        store.set(key, "done")
        return result
    store.wait([key])
    status = store.get(key).decode()
    if status != "done":
        raise UserError(f"stage {name} failed on rank 0 ({status})", fix="see rank 0's output")
    return OnRankZero(name)


def run_stage(
    name: str, cfg: Config, run: RunDir | Path | str, *, force: bool = False,
    save_config: bool = True, **options: Any,
) -> StageOutcome:  # fmt: skip
    """Run one stage on the run (skipped when finished with the same fingerprint and whole,
    unless `force`), then save the configuration it ran with as the run's config.toml (unless
    `save_config` is false); `options` are the command's own for the stage, the fields of the
    dataclass it declares (Stage.options: see each stage).
    Its result (of the type its Stage declares), Unfinished when it stopped early, None when
    its jobs run on a cluster, NotNeeded / OnRankZero (see hanlm.stages.stage)."""
    stage_module(name)  # an unknown name is a UserError listing the stages
    typed = stage_options(declaration(name), options)
    run = RunDir.of(run)
    with run_lock.hold(run.root):  # taken once per command; here for callers from Python
        result = _run_on_ranks(name, cfg, run, force, typed)
        if save_config and ranks.is_main():  # under torchrun, one writer
            save_run_config(cfg, run)
    return result


def _will_run(names: list[str], start: int, run: RunDir) -> list[str]:
    """The stages a pipeline will build: from `--from` (index `start`) or the first one not
    yet finished, whichever comes first, to the end of `names`. (A finished stage may still be
    built again when its settings changed; its inputs are then checked by the stage itself.)"""
    unfinished = next(
        (i for i, name in enumerate(names) if read_stage_marker(declaration(name).output(run)) is None),
        len(names),
    )  # fmt: skip
    return names[min(start, unfinished) :]


def run_pipeline(
    cfg: Config, run: RunDir | Path | str, *, from_stage: str | None = None,
    until: str | None = None,
) -> dict[str, StageOutcome]:  # fmt: skip
    """Stages in order up to `until` (all by default); complete ones are skipped unless at or
    after `from_stage`."""
    run = RunDir.of(run)
    names = list(STAGES)
    for name in (from_stage, until):
        if name is not None:
            stage_module(name)  # an unknown name is a UserError listing the stages
    start = names.index(from_stage) if from_stage else len(names)
    stop = names.index(until) + 1 if until else len(names)
    if stop <= start < len(names):
        raise UserError(f"--from {from_stage} comes after --until {until}", fix="swap them")
    if any(declaration(name).logs_to_trackers for name in names[:stop]):
        trackers.check(cfg.logging)  # before hours of data stages, not after
    run_inputs.check(cfg, _will_run(names[:stop], start, run))  # every rank: same answer
    results: dict[str, StageOutcome] = {}
    with run_lock.hold(run.root):  # no other command between two stages either
        for i, name in enumerate(names[:stop]):
            if ranks.is_main():
                info(f"[bold]== {name}[/bold]")
            results[name] = _run_on_ranks(
                name, cfg, run, i >= start, stage_options(declaration(name))
            )
            if ranks.is_main():
                save_run_config(cfg, run)
    return results
