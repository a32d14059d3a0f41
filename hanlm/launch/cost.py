"""What a launch is expected to cost, and what the hosts it tried did cost.

Expected: the plan's training and data-stage hours on every GPU of the launch, priced from the
catalogue (hanlm.plan.catalogue.PRICES; plan.price_per_gpu_hour overrides), plus two stated
allowances: hosts that preflight rejects (each paid from its start to its verdict) and, on spot
hosts, preemptions (each costing a restart and, on average, half a checkpoint interval of steps
done again). Spent: from the verdicts kept for every host set tried (preflight/hosts/), each
paid from its start (HANLM_HOST_STARTED_AT) to its verdict when rejected, or to the next host
set (it was lost) or the last stage's end when accepted.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from hanlm.plan import catalogue
from hanlm.preflight.report import PreflightReport
from hanlm.results import Part, Result


class ExpectedCost(Part):
    """`launch.json`'s `cost`: the plan's hours, the allowances and the price they are paid at."""

    market: str  # spot, on-demand
    price_per_gpu_hour: float | None
    price_source: str
    gpus: int
    training_hours: float  # wall-clock
    data_hours: float  # the data stages, on the first host while the others wait
    checkpoint_interval_hours: float
    minutes_per_rejected_host: float  # also what a host set without a recorded start is paid
    expected_rejected_host_sets: float
    rejected_gpu_hours: float
    expected_preemptions: float
    preemption_gpu_hours: float
    planned_gpu_hours: float
    expected_gpu_hours: float
    planned_cost: float | None = None
    expected_cost: float | None = None
    assumptions: list[str]


def price(plan_gpu: str, *, spot: bool, override: float | None) -> tuple[float | None, str]:
    if override is not None:
        return override, "plan.price_per_gpu_hour"
    found = catalogue.price_per_gpu_hour(plan_gpu, spot=spot)
    if found is None:
        return None, f"none in the catalogue for {plan_gpu}: set plan.price_per_gpu_hour"
    return found, catalogue.PRICES_SOURCE


def expected(cfg, plan) -> ExpectedCost:
    """The launch's expected cost for `cfg` (its [launch] assumptions) and its `plan`
    (hanlm.plan.estimate.Plan with a GPU and a token budget)."""
    launch, setup, time = cfg.launch, plan.setup, plan.time
    world, nodes = setup.world, setup.hosts
    gpu_price, source = price(setup.gpu, spot=launch.spot, override=setup.price_per_gpu_hour)
    training = time.wall_hours or 0.0
    data = (plan.data or {}).get("total_hours", 0.0)
    every_s = cfg.checkpoint.every * time.step_s
    if cfg.checkpoint.every_minutes:
        every_s = min(every_s, cfg.checkpoint.every_minutes * 60)
    interval_h = every_s / 3600
    passing = (1 - launch.rejected_host_share) ** nodes  # every host of a set must pass
    rejected_per_set = (1 - passing) / passing  # expected failures before a success
    preemptions = launch.preemptions_per_day * (training + data) / 24 if launch.spot else 0.0
    rejected_sets = rejected_per_set * (1 + preemptions)  # each restart rents hosts again
    rejected_h = rejected_sets * launch.minutes_per_rejected_host / 60 * world
    preemption_h = preemptions * (launch.minutes_per_restart / 60 + interval_h / 2) * world
    planned_h = (training + data) * world
    expected_h = planned_h + rejected_h + preemption_h
    assumptions = [
        f"{launch.rejected_host_share:.0%} of hosts fail preflight (launch.rejected_host_share), "
        f"each paid {launch.minutes_per_rejected_host:g} min (launch.minutes_per_rejected_host)",
        "preemptions: none (on-demand hosts)"
        if not launch.spot
        else f"{launch.preemptions_per_day:g} preemptions a day (launch.preemptions_per_day), "
        f"each {launch.minutes_per_restart:g} min to restart (launch.minutes_per_restart) and "
        f"half a checkpoint interval ({interval_h * 60:.0f} min) of steps done again",
        "the data stages run on the first host while the others wait: "
        f"{data:.2f} h from the plan's rates",
    ]
    cost = {}
    if gpu_price is not None:
        cost = {"planned_cost": planned_h * gpu_price, "expected_cost": expected_h * gpu_price}
    return ExpectedCost(
        market="spot" if launch.spot else "on-demand",
        price_per_gpu_hour=gpu_price,
        price_source=source,
        gpus=world,
        training_hours=training,
        data_hours=data,
        checkpoint_interval_hours=interval_h,
        minutes_per_rejected_host=launch.minutes_per_rejected_host,
        expected_rejected_host_sets=rejected_sets,
        rejected_gpu_hours=rejected_h,
        expected_preemptions=preemptions,
        preemption_gpu_hours=preemption_h,
        planned_gpu_hours=planned_h,
        expected_gpu_hours=expected_h,
        assumptions=assumptions,
        **cost,
    )


# --- what the hosts tried cost -----------------------------------------------------------------


def _time(text: str) -> datetime.datetime:
    stamp = datetime.datetime.fromisoformat(text)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def hosts_tried(preflight_dir: Path) -> list[PreflightReport]:
    """Every verdict kept in `preflight_dir`/hosts, oldest first."""
    folder = Path(preflight_dir) / PreflightReport.TRIED
    reports = [PreflightReport.read(path) for path in sorted(folder.glob("*.json"))]
    return sorted(reports, key=lambda r: _time(r.created_at))


def spent(
    preflight_dir: Path,
    *,
    price_per_gpu_hour: float | None,
    minutes_per_rejected_host: float,
    finished_at: datetime.datetime | None = None,
) -> dict[str, Any]:
    """Each host set tried (verdict, hosts, GPUs, hours paid, cost) and the totals."""
    reports = hosts_tried(preflight_dir)
    end = finished_at or datetime.datetime.now(datetime.timezone.utc)
    rows, estimated = [], False
    for i, report in enumerate(reports):
        verdict_at = _time(report.created_at)
        if report.host_started_at is not None:
            started = _time(report.host_started_at)
        else:  # not started by `hanlm launch`: the assumption stands in for the start
            started = verdict_at - datetime.timedelta(minutes=minutes_per_rejected_host)
            estimated = True
        if not report.go:
            until = verdict_at
        elif i + 1 < len(reports):  # lost (preempted) when the next host set started
            following = reports[i + 1]
            until = _time(following.host_started_at or following.created_at)
        else:
            until = end
        hours = max((until - started).total_seconds(), 0.0) / 3600
        gpus = max(report.expected_world_size, report.world_size)
        rows.append(
            {
                "verdict": report.verdict,
                "hosts": report.hosts,
                "started_at": started.isoformat(),
                "verdict_at": verdict_at.isoformat(),
                "gpus": gpus,
                "gpu_hours": hours * gpus,
                "reasons": [f.reason for f in report.findings if f.severity == "fail"],
            }
        )
    total = sum(r["gpu_hours"] for r in rows)
    rejected = sum(r["gpu_hours"] for r in rows if r["verdict"] != "GO")
    out: dict[str, Any] = {
        "host_sets": rows,
        "gpu_hours": total,
        "rejected_gpu_hours": rejected,
        "start_estimated": estimated,
        "price_per_gpu_hour": price_per_gpu_hour,
    }
    if price_per_gpu_hour is not None:
        out["cost"] = total * price_per_gpu_hour
        out["rejected_cost"] = rejected * price_per_gpu_hour
    return out


class LaunchRecord(Result):
    """`RUN/launch/launch.json`: what `hanlm launch` asked the engine for, what it expected to
    pay, which files it wrote and checked, and what the engine answered."""

    FILE = "launch.json"
    MADE_BY = "launch"

    engine: str
    created_at: str
    name: str
    nodes: int
    gpus_per_node: int
    accelerator: str | None
    spot: bool
    infra: str | None = None
    bucket: str | None = None
    disk_gb: int | None = None
    remote_run: str
    install: str | None = None
    files: list[str]
    validated: dict[str, Any]
    dry_run: bool
    submitted: dict[str, Any] | None = None
    cost: ExpectedCost
