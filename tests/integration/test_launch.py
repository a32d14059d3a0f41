"""`hanlm launch` rehearsed on this machine: the SkyPilot task's `run` section and the Slurm
script, each for 2 "nodes" on 127.0.0.1 with 2 CPU ranks per node, with the environment the
engine gives them (SkyPilot's SKYPILOT_* variables; Slurm's, through stand-in `srun` and
`scontrol` in tests/support/slurm/).

Each is stopped as its engine stops a job (a SIGTERM to one rank of one node; SIGUSR1 to the
Slurm script near its time limit), exits 75 on every node, and, started again, finishes. Stopped
at different steps, the two log the same losses bit for bit: each resume is exact. A forced
NO-GO preflight exits 69 before any training.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import TINY_PRETRAIN, copy_data_run, losses
from hanlm import exit_status
from hanlm.cli import main
from hanlm.errors import UserError
from hanlm.launch import skypilot
from hanlm.launch.cost import LaunchRecord
from hanlm.launch.torchrun import processes_below
from hanlm.pipeline import run_stage
from hanlm.preflight import collectives
from hanlm.preflight.report import PreflightReport
from hanlm.stages.rundir import load_run_config
from hanlm.train.checkpoint_layout import latest
from processes import free_port, ranks_below

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

SLURM_STANDINS = Path(__file__).resolve().parents[1] / "support" / "slurm"
BIN = str(Path(sys.executable).parent)  # where `hanlm` is installed
NODES, RANKS_PER_NODE = 2, 2
TRAIN = {
    **TINY_PRETRAIN,
    "pretrain.max_steps": 16,
    "pretrain.micro_batch": 2,
    "pretrain.global_batch_tokens": 512,  # one micro-batch of 2 rows on each of 4 ranks
    "checkpoint.every": 3,
    "logging.eval_every": 0,
    "checkpoint.backoff_s": 0.0,
    "parallel.mode": "fsdp",  # DDP's first step after a resume differs (docs/checkpoints.md)
    "launch.until": "pretrain",
    "plan.gpu": "rtx5090",
    "plan.gpus": RANKS_PER_NODE,
    "plan.hosts": NODES,
    "preflight.storage_mb": 4,
    "preflight.collective_mb": 1,
    "preflight.matmul_seconds": 0.05,
    "preflight.data_seconds": 0.1,
    # tiny steps projected at an RTX 5090's speed, and a disk shared with the other tests: only
    # the rehearsal's own faults may say NO-GO
    "preflight.max_save_fraction": 1000,
    "preflight.max_comm_ratio": 1000,
    "preflight.min_write_mb_s": 1,
    "preflight.max_fsync_ms": 60_000,
    "preflight.min_data_headroom": 0.1,
}


def needs_skypilot() -> None:
    try:
        skypilot.sky_python()
    except UserError as e:
        pytest.skip(f"SkyPilot's parser checks the task: {e.what} (scripts/setup.sh --dev)")


def launch_args(run_dir: Path, *extra: str) -> list[str]:
    """`hanlm launch --dry-run` for the rehearsal; SkyPilot's tasks name a bucket (two hosts
    need one), which the rehearsal replaces with the local run folder."""
    if "slurm" not in extra:
        needs_skypilot()
        extra = (*extra, "--bucket", "s3://hanlm-rehearsal")
    settings = {**TRAIN, "launch.master_port": free_port()}
    args = ["launch", "--run-dir", str(run_dir), "--dry-run", *extra]
    return args + [a for k, v in settings.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def write_launch(run_dir: Path, *extra: str) -> LaunchRecord:
    """`hanlm launch --dry-run` for the rehearsal, in this process."""
    assert main(launch_args(run_dir, *extra)) == 0
    return LaunchRecord.read(run_dir / "launch" / LaunchRecord.FILE)


def base_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        **extra,
    }


class Nodes:
    """Processes standing in for the hosts of one launch, each logging to a file."""

    def __init__(self, commands: list[tuple[list[str], dict[str, str]]], log_dir: Path, tag: str):
        self.logs = [log_dir / f"{tag}-node{i}.log" for i in range(len(commands))]
        self.procs = []
        for (cmd, env), log in zip(commands, self.logs, strict=True):
            with open(log, "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                )

    def output(self) -> str:
        return "\n".join(log.read_text(errors="replace")[-4000:] for log in self.logs)

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in self.procs]

    def ranks(self) -> dict[int, int]:
        found = {}
        for proc in self.procs:
            found.update(ranks_below(proc.pid))
        return found

    def stop(self) -> None:
        for proc in self.procs:
            pids = processes_below(proc.pid)
            for pid in [proc.pid, *pids]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()


def stop_after(run_dir: Path, nodes: Nodes, step: int, stop) -> int:
    """Once `step` steps are logged, `stop()` (a signal, as the engine sends it); returns the
    step the run stopped at after saving, once every node has exited 75."""
    metrics = run_dir / "pretrain" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in nodes.procs):
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= step:
                break
            time.sleep(0.05)
        assert all(p.poll() is None for p in nodes.procs), nodes.output()
        stop()
        codes, said = nodes.wait(), nodes.output()
    finally:
        nodes.stop()
    assert codes == [exit_status.STOPPED] * len(nodes.procs), said
    assert said.count("preempted:") == NODES * RANKS_PER_NODE, said  # every rank said so
    stopped_at = max(losses(run_dir))
    assert latest(run_dir / "pretrain" / "checkpoints").name == f"step-{stopped_at:08d}"
    assert step <= stopped_at < TRAIN["pretrain.max_steps"], said
    return stopped_at


def finish(nodes: Nodes) -> None:
    try:
        assert nodes.wait() == [0] * len(nodes.procs), nodes.output()
    finally:
        nodes.stop()


# --- SkyPilot ----------------------------------------------------------------------------------


def skypilot_nodes(
    run_dir: Path, log_dir: Path, tag: str, ranks_per_node: int = RANKS_PER_NODE,
    recipes: list[Path] | None = None, **fault_env: str,
) -> Nodes:  # fmt: skip
    """The task's run section on each node, with the variables SkyPilot sets there; the run
    folder, recipe and launch record are the local ones (on the hosts: the bucket and the
    copied RUN/launch), or `recipes`, one a node."""
    task = yaml.safe_load((run_dir / "launch" / "task.yaml").read_text())
    commands = []
    for rank in range(NODES):
        env = base_env(
            **{
                **task["envs"],
                "HANLM_RUN": str(run_dir),
                "HANLM_LAUNCH": str(run_dir / "launch"),
                "HANLM_RECIPE": str(
                    recipes[rank] if recipes else run_dir / "launch" / "recipe.toml"
                ),
            },
            SKYPILOT_NODE_RANK=str(rank),
            SKYPILOT_NODE_IPS="\n".join(["127.0.0.1"] * NODES),
            SKYPILOT_NUM_NODES=str(NODES),
            SKYPILOT_NUM_GPUS_PER_NODE=str(ranks_per_node),
            **fault_env,
        )
        commands.append((["bash", "-c", task["run"]], env))
    return Nodes(commands, log_dir, tag)


@pytest.fixture(scope="module")
def data_run(demo_run, tmp_path_factory) -> Path:
    data = copy_data_run(demo_run, tmp_path_factory.mktemp("launch") / "data")
    shutil.rmtree(data / "preflight" / "hosts", ignore_errors=True)  # the fixture's own host
    return data


@pytest.fixture(scope="module")
def stopped_early(data_run, tmp_path_factory) -> dict:
    """SkyPilot's run section on 2 nodes, one rank of node 1 sent SIGTERM (a host going away)
    just past the first checkpoint, then started again as SkyPilot's recovery does: the step
    it stopped at and every loss logged."""
    run_dir = copy_data_run(data_run, tmp_path_factory.mktemp("skypilot") / "run")
    write_launch(run_dir)
    nodes = skypilot_nodes(run_dir, run_dir.parent, "first")

    def sigterm_one_rank() -> None:
        ranks = nodes.ranks()
        assert sorted(ranks) == list(range(NODES * RANKS_PER_NODE)), ranks
        os.kill(ranks[3], signal.SIGTERM)

    stopped_at = stop_after(run_dir, nodes, TRAIN["checkpoint.every"] + 1, sigterm_one_rank)
    # the engine starts the same section again (on SkyPilot: new hosts, the same bucket)
    finish(skypilot_nodes(run_dir, run_dir.parent, "again"))
    return {"run_dir": run_dir, "stopped_at": stopped_at, "losses": losses(run_dir)}


def test_skypilot_run_section_stops_with_75_and_resumes(stopped_early):
    run_dir = stopped_early["run_dir"]
    assert sorted(stopped_early["losses"]) == list(range(1, TRAIN["pretrain.max_steps"] + 1))
    [tried] = sorted((run_dir / "preflight" / "hosts").glob("*.json"))  # the same hosts reuse it
    go = PreflightReport.read(tried)
    assert go.verdict == "GO" and go.world_size == NODES * RANKS_PER_NODE
    assert go.host_started_at is not None
    probes = [r.shared for r in go.ranks if r.shared and r.local_rank == 0]
    assert sorted(p["node"] for p in probes) == [0, 1]  # the bucket (here: one folder) is shared
    assert all(p["seen"] == [0, 1] for p in probes)
    for rank in go.ranks:
        for op in collectives.OPERATIONS:  # measured between the hosts, and right
            measured = rank.collectives[op]
            assert measured["correct"] and measured["busbw_gbs"] > 0
            factor = collectives.bus_factor(op, NODES * RANKS_PER_NODE)
            assert measured["busbw_gbs"] == pytest.approx(measured["algbw_gbs"] * factor)
        assert (rank.storage is not None) == (rank.local_rank == 0)  # one disk test a host
        assert "tokens_per_s" in rank.data
    assert go.projection["mode"] == "fsdp" and go.projection["comm_s"] > 0
    assert not list((run_dir / "pretrain" / "checkpoints").glob(".hanlm-preflight-*"))
    run_stage("report", load_run_config(run_dir), run_dir)
    card = (run_dir / "report.md").read_text()
    assert "**Launched** with skypilot on 2 x 2 x RTX5090" in card
    assert "spent so far (all host sets)" in card


def test_skypilot_no_go_exits_69_before_training(data_run, tmp_path, cli):
    """Hosts with two of the faults the field report met, on one rank per node to spare the
    cores: a failing collective between them (the consumer-GPU peer-to-peer bug, injected) and a
    checkpoint folder each host has to itself (a bucket that did not mount: here each node's
    recipe names a folder of its own). NO-GO on every node naming both, 69, nothing trained, and
    the verdict kept among the hosts tried, with what they cost."""
    run_dir = copy_data_run(data_run, tmp_path / "run")
    write_launch(run_dir)
    per_host = [tmp_path / f"host{i}" / "checkpoints" for i in range(NODES)]
    recipes = []
    for node, folder in enumerate(per_host):
        folder.parent.mkdir()
        recipe = tmp_path / f"recipe-node{node}.toml"
        text = (run_dir / "launch" / "recipe.toml").read_text()
        assert "\n[preflight]\n" in text and "checkpoint_dir" not in text
        own = f"\n[preflight]\ncheckpoint_dir = {json.dumps(str(folder))}\n"
        recipe.write_text(text.replace("\n[preflight]\n", own))
        recipes.append(recipe)
    nodes = skypilot_nodes(
        run_dir, tmp_path, "nogo", ranks_per_node=1, HANLM_FAULT_COLLECTIVE_ZEROS="1",
        recipes=recipes,
    )  # fmt: skip
    try:
        codes = nodes.wait()
    finally:
        nodes.stop()
    said = nodes.output()
    assert codes == [exit_status.HOST_REJECTED] * NODES, said
    assert "NO-GO" in said and "not shared by all hosts" in said
    assert not (run_dir / "pretrain").exists()
    [tried] = (run_dir / "preflight" / "hosts").glob("*.json")
    report = PreflightReport.read(tried)
    assert report.verdict == "NO-GO" and report.host_started_at is not None
    failures = {f.check: f for f in report.findings if f.severity == "fail"}
    assert "shared" in failures and failures.keys() - {"shared"}, failures  # and the collectives
    shared = failures["shared"]
    assert shared.reason.startswith("the checkpoint folder is not shared by all hosts")
    for node in (0, 1):
        assert f"(node {node}) does not see what {socket.gethostname()} (node {1 - node})" in (
            shared.reason
        )
    assert "mounts at the same path" in shared.fix and "checkpoint.mirror" in shared.fix
    for folder in per_host:
        assert not list(folder.parent.glob(".hanlm-preflight-*"))
    status = cli("launch", "--status", "--run-dir", str(run_dir), "--json")
    assert status.code == 0, status.err
    spent = json.loads(status.out[status.out.index("{") :])["spent"]
    assert [s["verdict"] for s in spent["host_sets"]] == ["NO-GO"]
    assert spent["rejected_gpu_hours"] == spent["gpu_hours"] > 0


# --- Slurm -------------------------------------------------------------------------------------


def slurm_job(
    run_dir: Path, log_dir: Path, tag: str, calls: Path, restarts: int = 0, **standin_env: str
) -> Nodes:
    """The sbatch script as Slurm runs it on the first node of a 2-node allocation."""
    env = base_env(
        **standin_env,
        PATH=f"{SLURM_STANDINS}:{BIN}:{os.environ['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST=",".join(["127.0.0.1"] * NODES),
        SLURM_JOB_NUM_NODES=str(NODES),
        SLURM_RESTART_COUNT=str(restarts),
        SCONTROL_CALLS=str(calls),
    )
    return Nodes([(["bash", str(run_dir / "launch" / "job.sbatch")], env)], log_dir, tag)


def test_slurm_script_rejects_nodes_requeues_at_the_time_limit_and_resumes_bit_exactly(
    data_run, stopped_early, tmp_path
):
    """Stopped at least two steps later than the SkyPilot rehearsal: the steps between are, here,
    a run never stopped and, there, a resumed one, and both resumed runs then go on. The same
    losses bit for bit at every step show both resumes exact."""
    run_dir = copy_data_run(data_run, tmp_path / "run")
    assert write_launch(run_dir, "--engine", "slurm").validated["bash -n"] == "ok"
    calls = tmp_path / "scontrol.calls"
    # an allocation preflight rejects (its ranks exit 69, as the SkyPilot rehearsal shows): the
    # job requeues itself without those nodes, until launch.max_restarts is spent
    rejected = {"SRUN_TASKS_EXIT": str(exit_status.HOST_REJECTED)}
    job = slurm_job(run_dir, tmp_path, "rejected", calls, **rejected)
    assert job.wait() == [exit_status.HOST_REJECTED], job.output()
    assert calls.read_text().splitlines()[-3:] == [
        "requeuehold 4242",
        "update JobId=4242 ExcNodeList=127.0.0.1,127.0.0.1",
        "release 4242",
    ]
    job = slurm_job(run_dir, tmp_path, "rejected", calls, restarts=3, **rejected)
    assert job.wait() == [exit_status.HOST_REJECTED]
    assert "3 retries spent, giving up" in job.output()
    assert calls.read_text().count("requeuehold") == 1
    # on other nodes; near its time limit Slurm sends the script SIGUSR1 (--signal=B:USR1@...)
    job = slurm_job(run_dir, tmp_path, "first", calls, restarts=1)
    later = stopped_early["stopped_at"] + 2
    stop_after(run_dir, job, later, lambda: job.procs[0].send_signal(signal.SIGUSR1))
    assert calls.read_text().splitlines()[-1] == "requeue 4242"
    finish(slurm_job(run_dir, tmp_path, "again", calls, restarts=2))
    assert losses(run_dir) == stopped_early["losses"]
