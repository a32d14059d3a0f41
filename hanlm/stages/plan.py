"""The plan stage: the recipe's memory, time and cost plan into `RUN/plan.json`
(see hanlm.plan.estimate)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from hanlm.config import Config
from hanlm.console import info
from hanlm.files import atomic_write_json, fingerprint, read_json
from hanlm.plan.estimate import make_plan, setup_from_config
from hanlm.plan.table import print_plan
from hanlm.stages.rundir import RunDir


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict[str, Any]:
    """The pipeline's `plan` stage: the recipe's plan, written to RUN/plan.json."""
    setup = setup_from_config(cfg)
    fp = fingerprint("plan", asdict(setup))
    path = RunDir.of(run).plan
    if not force and path.is_file():
        previous = read_json(path)
        if previous.get("fingerprint") == fp:
            info(f"plan: up to date in {path}, skipped")
            return previous
    plan = {**make_plan(setup), "fingerprint": fp}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, plan)
    print_plan(plan)
    info(f"plan: written to {path}")
    return plan
