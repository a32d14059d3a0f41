"""The plan stage: the recipe's memory, time and cost plan into `RUN/plan/plan.json`
(see hanlm.plan.recipe and hanlm.plan.estimate)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hanlm.config import Config
from hanlm.console import info
from hanlm.plan.estimate import Plan
from hanlm.plan.measured import RehearsalRecord
from hanlm.plan.recipe import plan_recipe, setup_from_config
from hanlm.plan.table import print_plan
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext


def rehearsal(run: RunDir) -> RehearsalRecord | None:
    """The run's rehearsal record, when `hanlm rehearse` made one: its measured speed stands
    for the assumed one when it timed the plan's shapes on the plan's hardware."""
    return RehearsalRecord.read_if_present(run.rehearsal_record)


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> dict[str, Any]:
    """The setup the plan is made from: it sizes the data stages' work from the local inputs'
    sizes, which the settings alone do not give, and takes a rehearsal's measured speed."""
    return asdict(setup_from_config(cfg, rehearsal=rehearsal(run)))


def build(ctx: StageContext) -> Plan:
    plan = plan_recipe(ctx.cfg, rehearsal=rehearsal(ctx.run))
    print_plan(plan)
    info(f"plan: written to {ctx.run.plan}")
    return plan


STAGE = Stage(
    name="plan",
    version=1,
    output=lambda run: run.plan.parent,
    result=Plan,
    reads=(
        "plan",
        "model",
        "pretrain",
        "precision.mode",
        "parallel",
        "checkpoint.async_save",
        "optimizer.name",  # Muon's state is smaller than AdamW's
        "tokenizer.vocab_size",
        "tokenizer.extend",  # continued pretraining: the rows added to the model's vocabulary
        "corpus",
        "data_engine",
        "decontam.enabled",
        "demo.size_mb",
        "sft.seq_len",  # SFT's memory per GPU, full and LoRA
        "sft.micro_batch",
        "sft.method",
        "sft.lora",
    ),
    build=build,
    inputs=inputs,
)
