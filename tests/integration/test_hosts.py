"""Two hosts rehearsed on one machine: two `hanlm torchrun` agents (`--nnodes 2 --nproc-per-node 1`,
a c10d rendezvous on 127.0.0.1) stand in for two hosts, each with one gloo rank.

Pretraining saves and resumes across them; one "host" killed mid-run (its agent and its worker:
torchrun starts workers in their own session) makes the other fail within seconds with a message
that names the lost rank and host, and both restarted resume from the last committed checkpoint
and compute the same losses, bit for bit. (Preflight's check that the checkpoint folder is shared
by the hosts is rehearsed in tests/integration/test_launch.py, with a launch's NO-GO.)
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_PRETRAIN, copy_data_run, losses
from hanlm import exit_status
from hanlm.errors import UserError
from hanlm.launch.torchrun import processes_below
from hanlm.train import peers
from hanlm.train.checkpoint_layout import latest
from processes import free_port, ranks_below

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

TRAIN = {
    **TINY_PRETRAIN,
    "pretrain.max_steps": 30,
    "checkpoint.every": 3,
    "logging.eval_every": 0,
    "checkpoint.backoff_s": 0.0,
}


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


class Host:
    """One torchrun agent with one worker: a stand-in for a host, logging to a file."""

    def __init__(self, name: str, port: int, hanlm_args: list[str], log_dir: Path):
        self.log = log_dir / f"{name}.log"
        cmd = [sys.executable, "-m", "hanlm", "torchrun", "--nnodes", "2"]
        cmd += ["--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"rehearsal-{port}"]
        cmd += ["--max-restarts", "0", "--monitor-interval", "0.2", "-m", "hanlm", *hanlm_args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        with open(self.log, "w") as out:
            # its own process group, like a host of its own
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def workers(self) -> list[int]:
        """Every process below the agent (its workers and theirs)."""
        return processes_below(self.proc.pid)

    def rank(self) -> int | None:
        """The global rank of this host's worker, from its environment."""
        return next(iter(ranks_below(self.proc.pid)), None)

    def kill(self) -> None:
        """The host is gone: SIGKILL its agent's process group and every worker."""
        pids = self.workers()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()


def start_hosts(hanlm_args_per_host: list[list[str]], log_dir: Path) -> list[Host]:
    port = free_port()
    return [
        Host(f"host{i}-{port}", port, args, log_dir) for i, args in enumerate(hanlm_args_per_host)
    ]


def wait_all(hosts: list[Host], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for host in hosts:
        codes.append(host.proc.wait(timeout=max(1.0, deadline - time.monotonic())))
    return codes


def stop_all(hosts: list[Host]) -> None:
    for host in hosts:
        if host.proc.poll() is None or host.workers():
            host.kill()


@pytest.fixture
def run_dir(demo_run, tmp_path):
    return copy_data_run(demo_run, tmp_path / "run")


def pretrain_args(run_dir: Path) -> list[str]:
    return ["pretrain", "--run-dir", str(run_dir), "--parallel", "ddp", *settings_args(TRAIN)]


def logged_losses(run_dir: Path) -> dict[int, float]:
    """The losses rank 0 logged, up to a line that a kill may have cut."""
    found = {}
    for line in (run_dir / "pretrain" / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            break
        if "loss" in record:
            found[record["step"]] = record["loss"]
    return found


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "pretrain" / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def lose_a_host_past_a_checkpoint(run_dir: Path, hosts: list[Host], lost: int) -> dict:
    """Wait until a checkpoint is committed and training is past it, then kill the host of rank
    `lost`; the other must fail within seconds, naming it. What was logged and committed."""
    root = run_dir / "pretrain" / "checkpoints"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and all(h.proc.poll() is None for h in hosts):
        committed = latest(root)
        if committed is not None and logged_steps(run_dir) > int(committed.name[5:]) + 1:
            break
        time.sleep(0.05)
    assert all(h.proc.poll() is None for h in hosts), [h.output()[-3000:] for h in hosts]
    ranks = [h.rank() for h in hosts]
    assert sorted(ranks) == [0, 1], ranks
    victim, survivor = (hosts[0], hosts[1]) if ranks[0] == lost else (hosts[1], hosts[0])
    victim.kill()
    killed_at = time.monotonic()
    before, committed = logged_losses(run_dir), latest(root)
    assert int(committed.name[5:]) < max(before) < TRAIN["pretrain.max_steps"]

    # its worker's status (it names the lost peer and stops: 75), whether its agent saw the
    # worker end or failed first, losing the rendezvous store that the lost host held
    assert survivor.proc.wait(timeout=60) == exit_status.STOPPED, survivor.output()[-3000:]
    noticed_s = time.monotonic() - killed_at
    said = survivor.output()
    named = f"lost 1 of 2 ranks: rank {lost} on host {socket.gethostname()} (node "
    assert named in said, said[-3000:]
    assert "its process is gone" in said and "resumes from the last committed" in said
    assert "Traceback" not in said.split(named)[0]  # the worker's message, not a stack trace
    assert noticed_s < 30, noticed_s  # well within the collective timeout (600 s)
    return {"losses": before, "committed": committed, "noticed_s": noticed_s}


@pytest.mark.slow
def test_two_hosts_train_lose_one_and_resume(run_dir, tmp_path):
    """The host lost is rank 0's, which also runs the c10d store (its agent started first): the
    hardest one to lose, and it is named just the same as any other."""
    hosts = start_hosts([pretrain_args(run_dir)] * 2, tmp_path)
    try:
        lost = lose_a_host_past_a_checkpoint(run_dir, hosts, lost=0)
        # both hosts come back: training resumes from the last committed checkpoint
        hosts = start_hosts([pretrain_args(run_dir)] * 2, tmp_path)
        codes = wait_all(hosts, timeout=240)
        assert codes == [0, 0], [h.output()[-3000:] for h in hosts]
        assert any(f"resumed from {lost['committed']}" in h.output() for h in hosts)
    finally:
        stop_all(hosts)
    before, after = lost["losses"], losses(run_dir)
    assert sorted(after) == list(range(1, TRAIN["pretrain.max_steps"] + 1))
    redone = [s for s in before if s > int(lost["committed"].name[5:])]
    assert redone  # steps computed before the loss and again after the resume
    for step in before:
        assert after[step] == before[step], step  # bit for bit
    print(f"lost peer noticed in {lost['noticed_s']:.2f} s; steps redone: {redone}")


# -- naming the lost peer, in one process ---------------------------------------------------------


def test_a_peer_whose_process_is_gone_is_named_and_a_live_one_is_not():
    alive = peers.listen()  # what each rank opens at start
    with socket.socket() as gone:  # a port nobody listens on any more: a dead process's
        gone.bind(("127.0.0.1", 0))
        gone_port = gone.getsockname()[1]
    roster = (
        peers.Peer(0, 0, "host-a", ("127.0.0.1", alive.getsockname()[1])),
        peers.Peer(1, 0, "host-a", ("127.0.0.1", alive.getsockname()[1])),
        peers.Peer(2, 1, "host-b", ("127.0.0.1", gone_port)),
    )
    try:
        error = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
        lost = peers.explain(error, roster, me=0)
        assert isinstance(lost, peers.PeerLost) and isinstance(lost, UserError)
        assert lost.what.startswith("lost 1 of 3 ranks: rank 2 on host host-b (node 1)")
        assert "its process is gone" in lost.what and "Connection closed by peer" in lost.what
        assert "resumes from the last committed checkpoint" in lost.fix
        # every peer answers: the error is something else and is left as it is
        assert peers.explain(error, roster[:2], me=0) is None
        assert peers.explain(UserError("bad setting"), roster, me=0) is None
        assert all(peers.knock(roster[1]) is None for _ in range(300))  # more than the backlog
    finally:
        alive.close()
