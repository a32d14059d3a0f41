"""`hanlm rehearse`: every stage of a recipe on this host, with the recipe's shapes and small
budgets, in `RUN/rehearsal/` (hanlm.rehearse.recipe), timed and measured; the record
`rehearsal.json` with the projection of the full run and the verdict.

The stages run through the pipeline as `hanlm run` runs them (every rank under torchrun, the
data stages on rank 0), each forced, in the rehearsal's own run folder: the run's folder gets
nothing else, and its checkpoints' mirror gets the rehearsal's under `RUN/rehearsal/...`.
Between them: the plan's memory for the micro-batch is checked before pretraining starts, the
mirror must hold pretraining's last checkpoint, pretraining is stopped hard in a save and resumed
(hanlm.rehearse.resume), `--tune` times the candidates that fit (hanlm.rehearse.tune), and
`hanlm serve` answers one request where llama.cpp is installed.
"""

from __future__ import annotations

import datetime
import json
import shutil
import socket
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from hanlm import exit_status, pipeline, ranks
from hanlm.config import Config
from hanlm.console import console, info, warn
from hanlm.errors import UserError
from hanlm.plan.catalogue import find
from hanlm.plan.measured import (
    BUG,
    HOST,
    INPUT,
    NOT_READY,
    READY,
    Projection,
    RehearsalRecord,
    StageRehearsal,
    shapes_key,
)
from hanlm.plan.recipe import plan_recipe, planned_parallel, setup_from_config
from hanlm.rehearse import figures, serving
from hanlm.rehearse import tune as tune_lib
from hanlm.rehearse.faults import STOPS, HostMemory, classify
from hanlm.rehearse.recipe import rehearsal_config
from hanlm.report.rehearsal_section import projection_lines, stage_line
from hanlm.stages.rundir import RunDir, save_run_config
from hanlm.stages.stage import NotNeeded, Unfinished

# what runs, in order: the pipeline's stages but the comparison (the same stages once more),
# with the rehearsal's own checks after the stage they follow
AFTER = {"pretrain": ("mirror", "resume"), "sft": ("serve",)}
LEFT_OUT = ("compare",)


def steps() -> list[str]:
    out: list[str] = []
    for name in pipeline.STAGES:
        if name not in LEFT_OUT:
            out += [name, *AFTER.get(name, ())]
    return out


@dataclass
class Failure:
    stage: str
    error: str
    fix: str | None
    fault: str
    exception: BaseException | None = None  # a bug's, raised again once the record is written


@dataclass
class Rehearsal:
    """One rehearsal in progress: the recipe, its rehearsal recipe and folder, what ran."""

    cfg: Config
    derived: Config
    run: RunDir
    sub: RunDir
    stages: list[StageRehearsal] = field(default_factory=list)
    failure: Failure | None = None
    device: str = "cpu"

    def figures_of(self, name: str) -> dict[str, Any]:
        found = next((s for s in self.stages if s.name == name), None)
        return found.figures if found is not None else {}


def _run_stage(r: Rehearsal, name: str) -> None:
    started = time.perf_counter()
    _reset_peak_memory()
    try:
        if name == "pretrain":
            _check_fits(r)
        outcome = pipeline.run_stage(name, r.derived, r.sub, force=True)
    except STOPS:  # a stop asked for (Ctrl-C, SIGTERM): the rehearsal ends there, as a run does
        raise
    except BaseException as e:
        _fail(r, name, e, time.perf_counter() - started)
        return
    seconds = time.perf_counter() - started
    if isinstance(outcome, NotNeeded):
        r.stages.append(StageRehearsal(name=name, status="not needed", seconds=seconds,
                                       error=outcome.reason))  # fmt: skip
        return
    if isinstance(outcome, Unfinished):
        r.failure = Failure(name, "stopped before its end", "see its output above", HOST)
        r.stages.append(StageRehearsal(name=name, status="failed", seconds=seconds,
                                       error=r.failure.error))  # fmt: skip
        return
    measured: dict[str, Any] = {}
    if name in figures.FIGURES:  # every rank: whichever writes the record has them
        measured = figures.FIGURES[name](r.sub, seconds, r.derived)
    r.stages.append(StageRehearsal(name=name, status="ok", seconds=seconds, figures=measured))


def _fail(r: Rehearsal, name: str, error: BaseException, seconds: float | None) -> None:
    fault, what, fix = classify(error)
    if fault == BUG:
        warn(f"rehearse: {name} failed with a bug:\n{traceback.format_exc()}")
    r.failure = Failure(name, what, fix, fault, error if fault == BUG else None)
    r.stages.append(
        StageRehearsal(name=name, status="failed", seconds=seconds, error=what, fix=fix)
    )


def _reset_peak_memory() -> None:
    import torch  # deferred: as in classify

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _check_fits(r: Rehearsal) -> None:
    """The plan's memory for the recipe's micro-batch, before pretraining tries it: a
    micro-batch the device cannot hold is refused here, not found by an out-of-memory."""
    planned = r.figures_of("plan")
    if planned.get("fits") is False:
        raise HostMemory(
            f"micro-batch {r.cfg.pretrain.micro_batch} x {r.cfg.pretrain.seq_len} tokens needs "
            f"{planned['planned_memory_gb']:.1f} GB per device by the plan, and this device has "
            f"{planned['capacity_gb']:.1f} GB",
            fix="lower pretrain.micro_batch or turn on parallel.activation_checkpointing "
            "(`hanlm plan` shows what fits; `hanlm rehearse --tune` times it)",
        )


def _mirror(r: Rehearsal) -> None:
    """Pretraining's last checkpoint is in its place under the mirror: the copy is best
    effort during a run (a warning), here it is a condition."""
    from hanlm.train import checkpoint_layout, checkpoint_mirror  # deferred: torch

    mirror = r.derived.checkpoint.mirror
    if not mirror:
        r.stages.append(StageRehearsal(name="mirror", status="not needed",
                                       error="no checkpoint.mirror"))  # fmt: skip
        return
    started = time.perf_counter()
    where = checkpoint_mirror.place(mirror, r.sub.pretrain.place)
    local = checkpoint_layout.latest(r.sub.pretrain.checkpoints)
    copied = checkpoint_mirror.mirror_latest(where) if ranks.rank() == 0 else None
    if ranks.rank() == 0 and (local is None or copied != local.name):
        r.failure = Failure(
            "mirror",
            f"the checkpoint mirror {where} holds {copied or 'no checkpoint'}, not "
            f"{local.name if local else 'the last one'} (the copy failed: see the warnings above)",
            "make checkpoint.mirror writable with room for a checkpoint (or a URL with "
            "credentials), or leave it unset",
            HOST,
        )
        r.stages.append(StageRehearsal(name="mirror", status="failed", error=r.failure.error,
                                       fix=r.failure.fix))  # fmt: skip
        return
    r.stages.append(StageRehearsal(name="mirror", status="ok", seconds=time.perf_counter() - started,
                                   figures={"place": where}))  # fmt: skip


def _resume(r: Rehearsal) -> None:
    from hanlm.rehearse import resume  # deferred: subprocesses, only here

    if ranks.world_size() != ranks.local_world_size():
        r.stages.append(StageRehearsal(name="resume", status="not needed", error=(
            "several hosts: the stop-and-resume check launches one host's ranks; rehearse "
            "one host alone for it")))  # fmt: skip
        return
    started = time.perf_counter()
    exact = r.device == "cpu" and not (r.derived.parallel.mode == "ddp" and ranks.world_size() >= 3)
    try:
        result = resume.stop_and_resume(r.sub, r.sub.config, ranks.world_size(), exact=exact)
    except UserError as e:
        _fail(r, "resume", e, time.perf_counter() - started)
        return
    seconds = time.perf_counter() - started
    if not result["agree"]:
        r.failure = Failure(
            "resume",
            f"the resumed pretraining's losses differ from the uninterrupted run's by up to "
            f"{result['max_loss_difference']:.3g} (promised: {result['promise']})",
            "a bug in hanlm's resume: report it with RUN/rehearsal/resume/pretrain.log",
            BUG,
        )
        r.stages.append(StageRehearsal(name="resume", status="failed", seconds=seconds,
                                       figures=result, error=r.failure.error))  # fmt: skip
        return
    r.stages.append(StageRehearsal(name="resume", status="ok", seconds=seconds, figures=result))


def _serve(r: Rehearsal) -> None:
    started = time.perf_counter()
    why_not = serving.unavailable()
    if why_not:
        r.stages.append(StageRehearsal(name="serve", status="not needed", error=why_not))
        return
    try:
        answered = serving.one_request(r.sub)
    except UserError as e:
        _fail(r, "serve", e, time.perf_counter() - started)
        return
    r.stages.append(StageRehearsal(name="serve", status="ok", seconds=time.perf_counter() - started,
                                   figures=answered))  # fmt: skip


# the rehearsal's own checks: rank 0 alone, the others wait for its word
OWN_CHECKS = {"mirror": _mirror, "resume": _resume, "serve": _serve}


def _own_check(r: Rehearsal, name: str) -> None:
    """A check of the rehearsal's own, on rank 0 while the others wait; every rank records
    what rank 0 found (its stage and failure, passed through the launch's store)."""
    if ranks.world_size() == 1:
        OWN_CHECKS[name](r)
        return
    store = pipeline.launch_store()
    key = f"rehearse/{name}"
    if ranks.rank() == 0:
        _release_devices()
        OWN_CHECKS[name](r)
        failed = r.failure is not None and r.failure.stage == name
        found = {
            "stage": r.stages[-1].model_dump(mode="json"),
            "failure": [r.failure.error, r.failure.fix, r.failure.fault] if failed else None,
        }
        store.set(key, json.dumps(found))
        return
    store.wait([key])
    found = json.loads(store.get(key).decode())
    r.stages.append(StageRehearsal.model_validate(found["stage"]))
    if found["failure"] is not None:
        r.failure = Failure(name, *found["failure"])


def _release_devices() -> None:
    """The cached memory this process holds on its GPU, given back before a child uses it."""
    import torch  # deferred: as in classify

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _device_name() -> str:
    import torch  # deferred: as in classify

    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(ranks.localranks.rank())


def _catalogue_key(device: str) -> str | None:
    """The planner's name of this device: `cpu`, its catalogue key, or None when the catalogue
    does not know it."""
    if device == "cpu":
        return "cpu"
    try:
        return find(device).key
    except UserError:
        return None


def _this_hardware(device: str) -> tuple[str, int, int] | None:
    """(plan.gpu, plan.gpus, plan.hosts) of this host and launch, for the rehearsal's plan."""
    gpu = _catalogue_key(device)
    if gpu is None:
        return None  # the recipe's plan.gpu stands in for a device the catalogue lacks
    per_host = ranks.local_world_size()
    return gpu, per_host, max(1, ranks.world_size() // per_host)


def _hardware_key(cfg: Config, device: str) -> dict[str, Any]:
    """The recipe's shapes on this hardware (hanlm.plan.measured.shapes_key), as a plan of
    this many devices of this kind would state them."""
    setup = setup_from_config(cfg, with_data=False)
    gpu = _catalogue_key(device) or device  # not in the catalogue: matched by no plan
    parallel = planned_parallel(cfg.parallel.mode, ranks.world_size())
    return shapes_key(replace(setup, gpu=gpu, gpus=ranks.world_size(), hosts=1, parallel=parallel))


def projection(r: Rehearsal) -> Projection | None:
    """The full run at the measured speeds, beside the plan's assumed ones."""
    measured = r.figures_of("pretrain").get("tokens_per_s")
    steps = r.cfg.pretrain.steps()
    if not measured or steps is None:
        return None
    tokens = float(r.cfg.pretrain.max_tokens or steps * r.cfg.pretrain.global_batch_tokens)
    gpus = ranks.world_size()
    hours = tokens / measured / 3600
    price = r.cfg.plan.price_per_gpu_hour
    planned = plan_recipe(r.cfg)
    time_plan = planned.time
    data_hours, planned_data_hours = _data_hours(r, planned.data)
    total = hours + (data_hours or 0.0)
    planned_total = None
    if time_plan is not None and time_plan.wall_hours is not None:
        planned_total = time_plan.wall_hours + (planned_data_hours or 0.0)
    return Projection(
        tokens=tokens,
        gpus=gpus,
        measured_tokens_per_s=measured,
        planned_tokens_per_s=time_plan.tokens_per_s if time_plan else None,
        pretrain_hours=hours,
        gpu_hours=hours * gpus,
        usd=hours * gpus * price if price is not None else None,
        planned_pretrain_hours=time_plan.wall_hours if time_plan else None,
        planned_gpu_hours=time_plan.gpu_hours if time_plan else None,
        planned_usd=time_plan.cost if time_plan else None,
        data_hours=data_hours,
        planned_data_hours=planned_data_hours,
        total_hours=total,
        planned_total_hours=planned_total,
    )


def _data_hours(r: Rehearsal, data: dict | None) -> tuple[float | None, float | None]:
    """The data stages' hours on the plan's cores at the measured MB/s per core (a stage the
    rehearsal did not measure keeps the plan's rate), and the plan's own."""
    if not data:
        return None, None
    total = 0.0
    for stage, planned in data["stages"].items():
        if "hours" not in planned:
            continue
        rate = r.figures_of(stage).get("mb_per_s_per_core") or planned["mb_per_s_per_core"]
        total += data["corpus_gb"] * 1e3 / (rate * data["effective_cores"]) / 3600
    return total, data["total_hours"]


def _record(r: Rehearsal, key: dict[str, Any], tune: dict | None) -> RehearsalRecord:
    fail = r.failure
    return RehearsalRecord(
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        run=str(r.run.root),
        hosts=[socket.gethostname()],
        device=r.device,
        world_size=ranks.world_size(),
        shapes=key,
        stages=r.stages,
        tune=(tune or {}).get("candidates"),
        tuned=(tune or {}).get("winner"),
        projection=projection(r) if fail is None else None,
        verdict=READY if fail is None else NOT_READY,
        failed_stage=fail.stage if fail else None,
        error=fail.error if fail else None,
        fix=fail.fix if fail else None,
        fault=fail.fault if fail else None,
    )


def rehearse(cfg: Config, run: RunDir | Path | str, *, tune: bool = False) -> RehearsalRecord:
    """Rehearse `cfg` on this host into `RUN/rehearsal/`; the record on every rank (rank 0
    writes it). A bug's exception is raised again once the record is written."""
    run = RunDir.of(run)
    sub = run.rehearsal
    device = _device_name()
    derived = rehearsal_config(cfg, ranks.world_size(), _this_hardware(device))
    r = Rehearsal(cfg, derived, run, sub, device=device)
    if ranks.rank() == 0:  # a rehearsal measures this host now: nothing of an earlier one stays
        shutil.rmtree(sub.root, ignore_errors=True)
        if derived.checkpoint.mirror:  # what the mirror holds afterwards, this one wrote
            _clear_mirror(derived.checkpoint.mirror, sub)
        sub.root.mkdir(parents=True)
        save_run_config(r.derived, sub)
    names = steps()
    for i, name in enumerate(names):
        if name in OWN_CHECKS:
            _own_check(r, name)
        else:
            _run_stage(r, name)
        if r.failure is not None:
            r.stages += [StageRehearsal(name=later, status="not run") for later in names[i + 1 :]]
            break
    tuned = None
    if tune and r.failure is None:
        tuned = tune_lib.tune(r.cfg, r.sub)
    record = _record(r, _hardware_key(cfg, r.device), tuned)
    if ranks.rank() == 0 or _failed_here(r):
        # a rank whose own training failed writes the record and leaves: torchrun then stops
        # the others, which may wait for it in a collective until their timeout
        record.write(run.rehearsal_record)
        report(record, run.rehearsal_record)
    if not _failed_here(r):
        _leave_together()
    if r.failure is not None and r.failure.exception is not None:
        raise r.failure.exception
    return record


def _clear_mirror(mirror: str, sub: RunDir) -> None:
    from hanlm.train import checkpoint_mirror  # deferred: torch

    checkpoint_mirror.remove(checkpoint_mirror.place(mirror, sub.place))


def _failed_here(r: Rehearsal) -> bool:
    """A rank but rank 0 failed in a stage it ran itself (not rank 0's failure, echoed)."""
    failure = r.failure
    if failure is None or ranks.rank() == 0 or failure.stage in OWN_CHECKS:
        return False
    return pipeline.declaration(failure.stage).all_ranks


def _leave_together() -> None:
    """Under torchrun the ranks leave once rank 0 has written the record: a rank that failed
    and left first would have torchrun stop the others before it is written."""
    if ranks.world_size() == 1:
        return
    store = pipeline.launch_store()
    if ranks.rank() == 0:
        store.set("rehearse/record", "written")
    else:
        store.wait(["rehearse/record"])


def report(record: RehearsalRecord, path: Path) -> None:
    """The rehearsal's table and verdict on the terminal."""
    table = Table(title=f"rehearsal: {record.world_size} x {record.device}")
    for column in ("stage", "status", "seconds", "measured"):
        table.add_column(column)
    for stage in record.stages:
        seconds = f"{stage.seconds:,.1f}" if stage.seconds is not None else ""
        table.add_row(stage.name, stage.status, seconds, stage_line(stage))
    console.print(table)
    for line in projection_lines(record):
        info(f"rehearse: {line}")
    for c in record.tune or []:
        measured = (
            f"{c['tokens_per_s']:,.0f} tokens/s, peak {c.get('peak_memory_gb', 0):.2f} GB"
            if c.get("tokens_per_s")
            else c.get("error", "no figures")
        )
        info(f"rehearse: tune {c['name']}: {measured}{'' if c['fits'] else ' (does not fit)'}")
    if record.tuned:
        info(f"rehearse: fastest that fits: {record.tuned['set']} ({record.tuned['why']})")
    if record.ready:
        info(f"rehearse: [bold green]ready[/bold green] (record: {path})")
    else:
        warn(
            f"rehearse: not ready: {record.failed_stage} failed: {record.error}"
            + (f"; fix: {record.fix}" if record.fix else "")
        )


def exit_status_of(record: RehearsalRecord) -> int:
    if record.ready:
        return exit_status.SUCCESS
    return {HOST: exit_status.HOST_REJECTED, INPUT: exit_status.USER_ERROR}.get(
        record.fault, exit_status.FAILED
    )
