"""What a rehearsal measured on a host (`hanlm rehearse`, hanlm.rehearse): the record
`RUN/rehearsal/rehearsal.json`, and which plans it speaks for.

A rehearsal runs every stage of a recipe with the recipe's shapes on the host (small budgets) and
records each stage's status, seconds and figures, the projection of the full run from what it
measured, and a verdict. The planner reads it back: a plan of the same shapes on the same
hardware (`shapes_key`) takes the measured tokens/s instead of an assumed MFU. Torch-free, so
the planner and the report card read it without loading training.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hanlm.plan.inputs import Setup
from hanlm.results import Part, Result

READY, NOT_READY = "ready", "not ready"
# whose fault a failed stage is: the exit status follows (hanlm.exit_status)
HOST, INPUT, BUG = "host", "input", "bug"


class StageRehearsal(Part):
    """One stage of the rehearsal: `status` ok, failed, not needed (the recipe skips it) or not
    run (after an earlier failure); its seconds and its own figures."""

    name: str
    status: str
    seconds: float | None = None
    figures: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    fix: str | None = None


class Projection(Part):
    """The full run priced from what the rehearsal measured, beside the plan's assumptions.
    GPU-hours = tokens / tokens_per_s / 3,600 x GPUs (pretraining); data hours from the data
    stages' measured MB/s per core on the plan's cores."""

    tokens: float
    gpus: int
    measured_tokens_per_s: float
    planned_tokens_per_s: float | None
    pretrain_hours: float
    gpu_hours: float
    usd: float | None
    planned_pretrain_hours: float | None
    planned_gpu_hours: float | None
    planned_usd: float | None
    data_hours: float | None
    planned_data_hours: float | None
    total_hours: float
    planned_total_hours: float | None


class RehearsalRecord(Result):
    """`RUN/rehearsal/rehearsal.json`: every stage's status, seconds and figures on this host,
    the projection of the full run and the verdict (`ready`, or `not ready` naming the first
    stage that failed, its error, the fix and whose fault: host, input or bug)."""

    FILE = "rehearsal.json"
    MADE_BY = "rehearse"

    created_at: str
    run: str  # the run folder it rehearsed
    hosts: list[str]
    device: str  # the device rank 0 trained on, as torch names it
    world_size: int
    shapes: dict[str, Any]  # shapes_key of the recipe on this hardware
    stages: list[StageRehearsal]
    tune: list[dict[str, Any]] | None = None  # --tune: every candidate's figures
    tuned: dict[str, Any] | None = None  # the winner and the --set line that adopts it
    projection: Projection | None = None
    verdict: str
    failed_stage: str | None = None
    error: str | None = None
    fix: str | None = None
    fault: str | None = None  # host, input or bug (None when ready)

    @property
    def ready(self) -> bool:
        return self.verdict == READY

    def stage(self, name: str) -> StageRehearsal | None:
        return next((s for s in self.stages if s.name == name), None)

    def measured_tokens_per_s(self) -> float | None:
        """Pretraining's tokens/s over all ranks, when the rehearsal measured it."""
        pretrain = self.stage("pretrain")
        if pretrain is None or pretrain.status != "ok":
            return None
        return pretrain.figures.get("tokens_per_s")


def shapes_key(setup: Setup) -> dict[str, Any]:
    """What pretraining's speed depends on: the model and its shapes, the numbers and the
    parallelism, and the hardware (its catalogue key, "cpu", and the number of devices)."""
    return {
        "model": setup.model,
        "vocab_size": setup.vocab_size,
        "seq_len": setup.seq_len,
        "micro_batch": setup.micro_batch,
        "precision": setup.precision,
        "parallel": setup.parallel,
        "recompute": setup.recompute,
        "compiled": setup.compiled,
        "optimizer": setup.optimizer,
        "gpu": setup.gpu,
        "devices": setup.world,
    }


def speaks_for(record: RehearsalRecord | None, setup: Setup) -> bool:
    """The record measured these shapes on this hardware: its tokens/s stand for the plan's."""
    return (
        record is not None
        and record.measured_tokens_per_s() is not None
        and record.shapes == shapes_key(setup)
    )
