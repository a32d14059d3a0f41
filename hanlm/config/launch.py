"""Before and around a run on rented or shared hardware: [plan], [preflight] and [launch]."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hanlm.config.base import Section


class PlanSection(Section):
    """`hanlm plan`: the hardware and budget to plan the recipe's pretraining for."""

    gpu: str | None = Field(
        None,
        description="catalogue GPU (rtx4090, rtx5090, l40s, a100-40gb, a100-80gb, h100, "
        "h200, b200), `cpu`, or unset to compare them all",
    )
    gpus: int = Field(1, ge=1, le=4096, description="GPUs per host")
    hosts: int = Field(1, ge=1, le=1024)
    tokens: float | None = Field(
        None, gt=0, description="training tokens (default: the pretrain section's length)"
    )
    price_per_gpu_hour: float | None = Field(
        None, ge=0, description="USD per GPU-hour", json_schema_extra={"cli": {"metavar": "USD"}}
    )
    mfu: float | None = Field(
        None,
        gt=0,
        le=1,
        description="model FLOPs utilisation of the plan and of preflight's projected step time "
        "(default: typical per GPU class)",
    )
    inter_host_gbps: float = Field(25.0, gt=0, description="network between hosts, Gbit/s")
    corpus_gb: float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="raw text the data stages read, GB of UTF-8; 0 = from the local input files, "
        "else from the token target (hf: inputs, demo)",
        json_schema_extra={"cli": {"metavar": "GB"}},
    )
    data_cores: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="CPU cores the data stages (corpus, decontam, shards) run on; 0 = "
        "data_engine.workers on a local engine, else this machine's cores",
        json_schema_extra={"cli": {"metavar": "N"}},
    )


class PreflightSection(Section):
    """`hanlm preflight`: measured checks of devices, collectives, storage and data loading."""

    timeout_s: float = Field(
        120,
        gt=0,
        description="rendezvous and collective timeout; a missing peer fails within it",
        json_schema_extra={"cli": {"flag": "timeout", "metavar": "S"}},
    )
    checkpoint_dir: str | None = Field(
        None,
        description="folder to test for checkpoints (default: DIR/pretrain/checkpoints)",
        json_schema_extra={"cli": {"metavar": "DIR"}},
    )
    matmul_seconds: float = Field(0.5, gt=0, description="time spent on each device's matmul test")
    collective_mb: float = Field(64, gt=0, description="payload of each collective test, MB")
    collective_iters: int = Field(5, ge=1, description="timed repetitions of each collective")
    storage_mb: float = Field(256, gt=0, description="bytes written (with fsync) by the disk test")
    fsync_probes: int = Field(10, ge=1, description="small write + fsync pairs timed for latency")
    data_seconds: float = Field(1.0, gt=0, description="time spent reading batches from the shards")
    min_matmul_fraction: float = Field(
        0.3, ge=0, le=1, description="NO-GO when a GPU's matmul reaches less of its catalogue peak"
    )
    max_comm_ratio: float = Field(
        1.0, gt=0, description="NO-GO when communication per step exceeds this times compute"
    )
    min_write_mb_s: float = Field(20, ge=0, description="NO-GO below this write throughput")
    max_fsync_ms: float = Field(2000, gt=0, description="NO-GO above this fsync latency")
    max_save_fraction: float = Field(
        0.5, gt=0, description="NO-GO when a save takes more than this share of its interval"
    )
    min_data_headroom: float = Field(
        2.0, gt=0, description="NO-GO when the loader is less than this many times fast enough"
    )
    fail_on_no_go: bool = Field(
        True,
        description="in the pipeline, stop on NO-GO",
        json_schema_extra={"cli": {"flag": False}},  # only the pipeline reads it: --set
    )


class LaunchSection(Section):
    """`hanlm launch`: the recipe onto rented GPUs (SkyPilot) or a cluster (Slurm). The hardware
    is the plan's (plan.gpu, plan.gpus per host, plan.hosts); the cost assumptions are stated
    here so that the launch prints and keeps them."""

    engine: Literal["skypilot", "slurm"] = Field(
        "skypilot",
        description="what starts the hosts: SkyPilot (clouds, RunPod, Vast.ai, "
        "Lambda, Kubernetes) or Slurm (sbatch + srun)",
    )
    spot: bool = Field(
        False, description="spot (preemptible) hosts: cheaper, and a preempted run is resumed"
    )
    accelerator: str | None = Field(
        None,
        description="SkyPilot's accelerator name (default: plan.gpu's, e.g. RTX5090, H100)",
        json_schema_extra={"cli": {"metavar": "NAME"}},
    )
    infra: str | None = Field(
        None,
        description="SkyPilot infra to run on, e.g. runpod, vast, lambda, aws/us-east-1, k8s "
        "(default: the cheapest SkyPilot finds)",
        json_schema_extra={"cli": {"metavar": "INFRA"}},
    )
    bucket: str | None = Field(
        None,
        description="bucket that holds the run folder on the hosts and outlives them "
        "(s3://NAME, gs://NAME, r2://NAME or a name); needed for several hosts, for spot "
        "hosts advised",
        json_schema_extra={"cli": {"metavar": "URL"}},
    )
    disk_gb: int | None = Field(
        None,
        ge=10,
        description="each host's disk, GB (default: the corpus, shards and "
        "checkpoints the plan expects, doubled, at least 100)",
    )
    install: str | None = Field(
        None,
        description="pip requirement that installs hanlm on the hosts (default: "
        "hanlm[EXTRAS]==this version, the extras the recipe needs)",
        json_schema_extra={"cli": {"metavar": "REQUIREMENT"}},
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="hosts tried again after a NO-GO preflight or a crash (a preempted run is "
        "always resumed)",
    )
    until: str = Field(
        "report",
        description="the last stage the hosts run, e.g. pretrain to train there and evaluate "
        "elsewhere",
        json_schema_extra={"cli": {"flag": "launch-until", "metavar": "STAGE"}},
    )
    rehearse: bool = Field(
        False,
        description="on each host set, after preflight and before the run, `hanlm rehearse` "
        "(every stage at the recipe's shapes, minutes): a host set it finds at fault is "
        "handled as a NO-GO one",
    )
    master_port: int = Field(29500, ge=1024, le=65535, description="torchrun's port on host 0")
    rejected_host_share: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="assumed share of rented hosts preflight rejects (the field report: 3 of 4)",
    )
    minutes_per_rejected_host: float = Field(
        15,
        ge=0,
        description="assumed minutes a rejected host is paid for: start, install, preflight",
    )
    preemptions_per_day: float = Field(
        2.0, ge=0, description="assumed preemptions per day of a spot run (on-demand: none)"
    )
    minutes_per_restart: float = Field(
        15,
        ge=0,
        description="assumed minutes a preemption costs besides the lost steps: a "
        "new host, install, resume",
    )
    partition: str | None = Field(
        None, description="Slurm partition", json_schema_extra={"cli": {"metavar": "NAME"}}
    )
    time_limit_hours: float | None = Field(
        None,
        gt=0,
        description="Slurm time limit of one allocation (default: the plan's wall time and a "
        "quarter, at least 1 h); the job requeues itself when it is reached",
    )
    signal_seconds: int = Field(
        300,
        ge=30,
        description="Slurm: seconds before the time limit that the job is told to save and stop",
    )
