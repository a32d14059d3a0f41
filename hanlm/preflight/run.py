"""`hanlm preflight`'s checks on every rank: join, measure, judge, write the report (see the
package's docstring for what is checked and how faults are injected)."""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import torch.distributed as torch_dist

from hanlm import ranks
from hanlm.config import Config
from hanlm.errors import PreflightNoGo, UserError
from hanlm.inference import resolve_device
from hanlm.preflight import collectives, data, devices, shared, storage, table, verdict
from hanlm.preflight.report import PreflightReport
from hanlm.train import parallel, trackers
from hanlm.train.parallel import Dist

STAGE = "preflight"


def rendezvous_address() -> str | None:
    if ranks.world_size() <= 1:
        return None
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def _join(cfg: Config) -> tuple[Dist, dict | None]:
    """The process group, or this process alone and a finding when the rendezvous failed."""
    try:
        return parallel.init(cfg.parallel.device, timeout_s=cfg.preflight.timeout_s), None
    except UserError as e:
        if "could not join the process group" not in e.what:
            raise  # e.g. a GPU was asked for and none is visible: the user's setting
        failure = verdict.finding(
            "rendezvous",
            verdict.FAIL,
            f"rank {ranks.rank()} waited {cfg.preflight.timeout_s:g} s: {e.what}",
            "start the same torchrun command on every host with the same --rdzv-endpoint "
            f"(here {rendezvous_address()}), open that port in the firewall, or raise "
            "preflight.timeout_s when hosts start far apart",
        )
    local_rank = ranks.local_rank()
    # the one device rule (training's too): parallel.init already applied it before failing
    device = resolve_device(cfg.parallel.device, setting="parallel.device", local_rank=local_rank)
    alone = Dist(ranks.rank(), 1, local_rank, device)
    return alone, failure


def host_started_at() -> str | None:
    """HANLM_HOST_STARTED_AT (seconds since the epoch, as `date +%s` writes it, set by the
    scripts of `hanlm launch` when the host starts) as an ISO time, or None."""
    value = os.environ.get("HANLM_HOST_STARTED_AT", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def _guarded(measure, *args, **kwargs) -> dict:
    """A local check never raises: a rank that died here would leave its peers waiting."""
    try:
        return measure(*args, **kwargs)
    except Exception as e:  # reported as a finding, with its type, instead of a hang
        return {"error": f"{type(e).__name__}: {e}"}


def _measure_rank(
    cfg: Config, shards_dir: Path, dist: Dist, folder: Path, without_shards: str
) -> dict:
    preflight_cfg = cfg.preflight
    result = {
        "rank": dist.rank,
        "local_rank": dist.local_rank,
        "host": socket.gethostname(),
        "devices": _guarded(
            devices.probe,
            dist.device,
            all_visible=not dist.distributed,
            seconds=preflight_cfg.matmul_seconds,
        ),
        "collectives": None,
        "shared": None,
        "storage": None,
    }
    if dist.distributed:  # every rank takes part, even if its devices failed
        result["collectives"] = _guarded(
            collectives.measure,
            dist,
            size_mb=preflight_cfg.collective_mb,
            iters=preflight_cfg.collective_iters,
        )
        # a collective too; it reports its own errors instead of raising
        result["shared"] = shared.probe(dist, folder)
    if dist.local_rank == 0:  # one disk test per host: ranks of a host share its disk
        result["storage"] = _guarded(
            storage.measure,
            folder,
            size_mb=preflight_cfg.storage_mb,
            probes=preflight_cfg.fsync_probes,
        )
    result["trackers"] = _guarded(_trackers_ready, cfg)
    result["data"] = _guarded(
        data.measure,
        cfg,
        shards_dir,
        rank=dist.rank,
        world_size=dist.world_size,
        seconds=preflight_cfg.data_seconds,
        without_shards=without_shards,
    )
    return result


def _trackers_ready(cfg: Config) -> dict:
    """{"trackers": the ones training will open} or {"refused": what stops them and the fix}."""
    try:
        trackers.check(cfg.logging)
    except UserError as e:
        return {"refused": e.what, "fix": e.fix}
    return {"trackers": trackers.chosen(cfg.logging)}


def check(
    cfg: Config, *, folder: Path, shards_dir: Path, report_path: Path,
    without_shards: str = data.WITHOUT_SHARDS,
) -> PreflightReport:  # fmt: skip
    """Measure (storage at the checkpoint `folder`, data loading from `shards_dir`), judge,
    write `report_path` (rank 0) and print the table; every rank gets the whole report.
    `without_shards`: what to do when `shards_dir` has none yet."""
    dist, rendezvous_failure = _join(cfg)
    try:
        mine = _measure_rank(cfg, shards_dir, dist, folder, without_shards)
        reports = [mine]
        if dist.distributed:
            reports = [None] * dist.world_size
            torch_dist.all_gather_object(reports, mine)
        report = {
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "world_size": dist.world_size,
            "expected_world_size": ranks.world_size(),
            "hosts": sorted({r["host"] for r in reports}),
            "rendezvous": rendezvous_address(),
            "checkpoint_dir": str(folder),
            "findings": [rendezvous_failure] if rendezvous_failure else [],
            "ranks": reports,
            "host_started_at": host_started_at(),
        }
        verdict.judge(cfg, report)
        typed = PreflightReport.model_validate(report)
        try:
            if dist.rank == 0:
                typed.write(report_path)
                typed.keep_as_tried(report_path)
            if dist.rank == 0 or rendezvous_failure:  # alone, every rank tells its own story
                table.print_report(report)
        finally:  # no rank exits (and makes torchrun stop the others) before rank 0 is done
            parallel.barrier(dist)
        return typed
    finally:
        parallel.shutdown(dist)


def no_go_error(report: PreflightReport, report_path: Path) -> PreflightNoGo:
    failed = [f for f in report.findings if f.severity == verdict.FAIL]
    fixes = [f.fix for f in failed if f.fix]
    return PreflightNoGo(
        "preflight says NO-GO: " + "; ".join(f"{f.check}: {f.reason}" for f in failed),
        where=str(report_path),
        fix="; ".join(dict.fromkeys(fixes))
        + " (or set preflight.fail_on_no_go=false to train anyway)",
    )
