"""`hanlm launch`: the recipe's plan priced, the engine's job written into `RUN/launch/`,
checked with the engine's own parser, and submitted (unless --dry-run); `--status` lists the
hosts tried with their verdicts and what they cost."""

from __future__ import annotations

import datetime
import glob
import re
from collections.abc import Collection
from pathlib import Path

from rich.table import Table

from hanlm import __version__
from hanlm.config import Config, config_to_toml
from hanlm.console import console, info, warn
from hanlm.data import dataset_repo
from hanlm.data.readers import is_demo
from hanlm.errors import UserError
from hanlm.files import atomic_write_text
from hanlm.launch import cost, skypilot, slurm
from hanlm.launch.cost import LaunchRecord
from hanlm.plan.estimate import Plan
from hanlm.plan.recipe import plan_recipe

LAUNCH_DIR = "launch"  # RUN/launch: the engine's job, the recipe the hosts read, launch.json
PREFLIGHT_DIR = "preflight"  # RUN/preflight: the verdicts of the hosts tried (preflight/hosts)

GB = 1e9
CHECKPOINT_BYTES_PER_PARAMETER = 16  # fp32 weights and AdamW's two moments, and a bf16 copy


def job_name(run: Path) -> str:
    """SkyPilot's and Slurm's name for the run: lower-case letters, digits and dashes."""
    name = re.sub(r"[^a-z0-9-]+", "-", run.resolve().name.lower()).strip("-") or "run"
    return f"hanlm-{name}"[:60].rstrip("-")


def _needs_gpu_plan(cfg: Config) -> Plan:
    if cfg.plan.gpu in (None, "cpu"):
        raise UserError(
            f"plan.gpu is {cfg.plan.gpu!r}: a launch rents the GPUs the plan names",
            where="plan.gpu",
            fix="set plan.gpu (e.g. --gpu rtx5090), plan.gpus per host and plan.hosts; "
            "`hanlm plan` without --gpu compares the catalogue",
        )
    plan = plan_recipe(cfg)
    if plan.time is None or plan.time.wall_hours is None:
        raise UserError(
            "the plan has no training length to price",
            fix="set pretrain.max_steps or pretrain.max_tokens (or plan.tokens)",
        )
    return plan


def disk_gb(cfg: Config, plan: Plan) -> int:
    """Each host's disk: the raw corpus, its cleaned copy and the shards, and the checkpoints
    kept, doubled for the logs and the Python environment, at least 100 GB."""
    if cfg.launch.disk_gb:
        return cfg.launch.disk_gb
    corpus = (plan.data or {}).get("corpus_gb", 0.0) * 3
    checkpoints = plan.model.parameters * CHECKPOINT_BYTES_PER_PARAMETER / GB
    checkpoints *= cfg.checkpoint.keep_last + 1
    return max(100, int(2 * (corpus + checkpoints)) + 1)


def install_requirement(cfg: Config) -> str:
    """The pip requirement that installs hanlm on the hosts, with the extras the recipe uses."""
    if cfg.launch.install:
        return cfg.launch.install
    extras = set()
    if any(i.startswith("hf:") for i in cfg.corpus.all_inputs()):
        extras.add("hf")
    extras |= {t for t in cfg.logging.trackers or () if t in ("wandb", "trackio", "tensorboard")}
    return (
        f"hanlm[{','.join(sorted(extras))}]=={__version__}" if extras else f"hanlm=={__version__}"
    )


def _glob_root(spec: str) -> Path:
    """The folder of a local input (a file or glob): what is copied to the hosts."""
    parts = Path(spec).expanduser().absolute().parts
    fixed = [p for p in parts[: next((i for i, p in enumerate(parts) if glob.has_magic(p)), None)]]
    root = Path(*fixed) if fixed else Path("/")
    return root if root.is_dir() else root.parent


def remote_inputs(cfg: Config) -> tuple[Config, dict[str, str]]:
    """The recipe with its local files (corpus inputs, sft data, local snapshots named by hf:,
    decontam.benchmarks and eval.tasks paths) at the paths the hosts get them at, and the file mounts that copy them
    there (remote folder -> local folder)."""
    mounts: dict[str, str] = {}

    def mounted(root: Path) -> str:
        target = next((r for r, local in mounts.items() if local == str(root)), None)
        if target is None:
            target = f"{skypilot.INPUTS}/{len(mounts)}-{root.name or 'root'}"
            mounts[target] = str(root)
        return target

    def remote(spec: str, key: str) -> str:
        folder = dataset_repo.snapshot_folder(spec) if dataset_repo.is_hf_id(spec) else None
        if folder is not None:  # a local snapshot travels as a folder; its name follows it
            name = dataset_repo.parse_hf(spec)[0]
            return "hf:" + mounted(folder.expanduser().absolute()) + spec[len("hf:") + len(name) :]
        if spec.startswith("hf:") or is_demo(spec):
            return spec
        root = _glob_root(spec)
        if not glob.glob(str(Path(spec).expanduser())):
            raise UserError(
                f"{key} {spec!r} matches nothing here: a launch copies the recipe's local "
                "inputs to the hosts",
                where=key,
                fix="run `hanlm launch` where the inputs are, or give them as hf: ids the "
                "hosts download",
            )
        local = Path(spec).expanduser().absolute()
        return str(Path(mounted(root)) / local.relative_to(root))

    data = cfg.model_dump(mode="json")
    if cfg.corpus.sources:
        del data["corpus"]["inputs"]  # the sources hold them
        for source in data["corpus"]["sources"]:
            key = f"corpus source {source['name']!r} input"
            source["inputs"] = [remote(i, key) for i in source["inputs"]]
    else:
        data["corpus"]["inputs"] = [remote(i, "corpus.inputs") for i in data["corpus"]["inputs"]]
    if cfg.sft.data:
        data["sft"]["data"] = remote(cfg.sft.data, "sft.data")
    for source in data["sft"]["sources"]:
        key = f"sft source {source['name']!r} input"
        source["inputs"] = [remote(i, key) for i in source["inputs"]]

    def named(spec: str, key: str) -> str:  # TASK=PATH
        task, sep, path = spec.partition("=")
        return f"{task}={remote(path, key)}" if sep else spec

    data["decontam"]["benchmarks"] = [
        named(b, "decontam.benchmarks") for b in data["decontam"]["benchmarks"]
    ]
    data["eval"]["tasks"] = [named(t, "eval.tasks") for t in data["eval"]["tasks"]]
    return Config.model_validate(data), mounts


def _check_until(cfg: Config, stages: Collection[str]) -> None:
    if cfg.launch.until not in stages:
        raise UserError(
            f"launch.until {cfg.launch.until!r} is not a stage",
            where="launch.until",
            fix=f"choose one of {', '.join(stages)}",
        )


def _check_storage(cfg: Config) -> None:
    launch = cfg.launch
    if launch.engine == "skypilot" and cfg.plan.hosts > 1 and not launch.bucket:
        raise UserError(
            f"{cfg.plan.hosts} hosts need one run folder they all see (every rank writes its "
            "part of each checkpoint into it)",
            where="launch.bucket",
            fix="set launch.bucket to a bucket (s3://NAME, gs://NAME, r2://NAME or a name for "
            "SkyPilot to make); every host mounts it",
        )
    if launch.engine == "skypilot" and launch.spot and not launch.bucket:
        warn(
            "spot hosts without launch.bucket: a preempted host takes the run folder and its "
            "checkpoints with it, and the recovered job starts over; set launch.bucket"
        )


def launch(cfg: Config, run: Path, *, stages: Collection[str], dry_run: bool) -> LaunchRecord:
    """Price, write, check and (unless dry_run) submit; returns what launch.json records.
    `stages` are the pipeline's, which launch.until must name."""
    run = Path(run).absolute()
    _check_until(cfg, stages)
    plan = _needs_gpu_plan(cfg)
    _check_storage(cfg)
    expected = cost.expected(cfg, plan)
    folder = run / LAUNCH_DIR
    name = job_name(run)
    launch_cfg = cfg.launch
    disk, install = disk_gb(cfg, plan), install_requirement(cfg)
    files, accelerator = [], None
    if launch_cfg.engine == "skypilot":
        accelerator = skypilot.accelerator(cfg)
        remote_cfg, mounts = remote_inputs(cfg)
        recipe = folder / "recipe.toml"
        if launch_cfg.bucket:
            remote_run = f"{skypilot.BUCKET_MOUNT}/{run.name}"
        else:
            remote_run = f"~/hanlm-runs/{run.name}"
        task = skypilot.task(
            cfg,
            name=name,
            remote_run=remote_run,
            launch_dir=folder,
            disk_gb=disk,
            install=install,
            inputs=mounts,
        )
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(recipe, config_to_toml(remote_cfg))
        job = skypilot.write(task, folder / "task.yaml")
        files = [str(recipe), str(job)]
        [validated] = skypilot.validate(job)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        recipe = folder / "recipe.toml"
        atomic_write_text(recipe, config_to_toml(cfg))
        remote_run = str(run)
        job = folder / "job.sbatch"
        text = slurm.script(
            cfg,
            name=name,
            run=run,
            recipe=recipe,
            script_path=job,
            hours=expected.training_hours + expected.data_hours,
            cpu=False,
        )
        atomic_write_text(job, text)
        job.chmod(0o755)
        files = [str(recipe), str(job)]
        validated = slurm.validate(job)
    record = LaunchRecord(
        engine=launch_cfg.engine,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        name=name,
        nodes=cfg.plan.hosts,
        gpus_per_node=cfg.plan.gpus,
        accelerator=accelerator,
        spot=launch_cfg.spot,
        infra=launch_cfg.infra,
        bucket=launch_cfg.bucket,
        disk_gb=disk if launch_cfg.engine == "skypilot" else None,
        remote_run=remote_run,
        install=install if launch_cfg.engine == "skypilot" else None,
        files=files,
        validated=validated,
        dry_run=dry_run,
        cost=expected,
    )
    record_path = folder / LaunchRecord.FILE
    record.write(record_path)
    print_launch(record)
    if dry_run:
        info(f"launch: dry run, nothing submitted; {record_path}")
        return record
    engine = skypilot if launch_cfg.engine == "skypilot" else slurm
    submitted = engine.submit(job, name)
    record = record.model_copy(update={"submitted": submitted})
    record.write(record_path)
    info(f"launch: submitted {submitted}; {record_path}")
    return record


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} USD"


def print_launch(record: LaunchRecord) -> None:
    c = record.cost
    hardware = f"{record.nodes} x {record.gpus_per_node} x {record.accelerator or 'GPU'}"
    price = "no price" if c.price_per_gpu_hour is None else f"{c.price_per_gpu_hour:.2f} USD"
    console.print(
        f"[bold]launch:[/bold] {record.engine}, {hardware}, {c.market} at {price} per "
        f"GPU-hour ({c.price_source})",
        soft_wrap=True,
    )
    table = Table("", "GPU-hours", "cost", title="expected cost")
    table.add_row(
        f"plan: training {c.training_hours:,.2f} h + data stages {c.data_hours:,.2f} h, "
        f"{c.gpus} GPUs",
        f"{c.planned_gpu_hours:,.1f}",
        _usd(c.planned_cost),
    )
    each = c.price_per_gpu_hour or 0.0
    table.add_row(
        f"rejected hosts: {c.expected_rejected_host_sets:.2f} host sets expected",
        f"{c.rejected_gpu_hours:,.1f}",
        _usd(c.rejected_gpu_hours * each if c.price_per_gpu_hour is not None else None),
    )
    table.add_row(
        f"preemptions: {c.expected_preemptions:.2f} expected",
        f"{c.preemption_gpu_hours:,.1f}",
        _usd(c.preemption_gpu_hours * each if c.price_per_gpu_hour is not None else None),
    )
    table.add_row("[bold]expected[/bold]", f"{c.expected_gpu_hours:,.1f}", _usd(c.expected_cost))
    console.print(table)
    for assumption in c.assumptions:
        console.print(f"  assumed: {assumption}", soft_wrap=True)
    for path in record.files:
        console.print(f"  wrote {path}", soft_wrap=True)
    checks = ", ".join(f"{k}: {v}" for k, v in record.validated.items())
    console.print(f"  checked by the engine: {checks}", soft_wrap=True)


def status(cfg: Config, run: Path) -> dict:
    """The hosts tried for `run` (their verdicts and hours), against launch.json's plan."""
    run = Path(run)
    record = LaunchRecord.read_if_present(run / LAUNCH_DIR / LaunchRecord.FILE)
    if record is not None:
        gpu_price, minutes = record.cost.price_per_gpu_hour, record.cost.minutes_per_rejected_host
    else:
        gpu_price, minutes = cfg.plan.price_per_gpu_hour, cfg.launch.minutes_per_rejected_host
    spent = cost.spent(
        run / PREFLIGHT_DIR, price_per_gpu_hour=gpu_price, minutes_per_rejected_host=minutes
    )
    table = Table("verdict", "hosts", "GPUs", "GPU-hours", "why", title="hosts tried")
    for row in spent["host_sets"]:
        table.add_row(
            row["verdict"],
            ", ".join(row["hosts"]),
            str(row["gpus"]),
            f"{row['gpu_hours']:,.2f}",
            "; ".join(row["reasons"]) or "-",
        )
    console.print(table)
    paid = _usd(spent.get("cost"))
    console.print(
        f"spent: {spent['gpu_hours']:,.2f} GPU-hours ({paid}), of which rejected hosts "
        f"{spent['rejected_gpu_hours']:,.2f} ({_usd(spent.get('rejected_cost'))})"
        + (
            f"; planned {record.cost.expected_gpu_hours:,.1f} GPU-hours "
            f"({_usd(record.cost.expected_cost)})"
            if record
            else ""
        ),
        soft_wrap=True,
    )
    return {"launch": record.to_json() if record else None, "spent": spent}
