"""`hanlm preflight`: GO on a healthy setup, NO-GO with the right reason for each injected fault.

Storage and rendezvous faults run in this process (cheap); the collectives run under
`torchrun --nproc_per_node 2` on CPU (gloo) with wrong results; healthy collectives are
measured between two hosts in test_hosts.py.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import TINY_PRETRAIN, assert_user_error, copy_data_run
from hanlm import exit_status
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.preflight import collectives, verdict
from hanlm.preflight.report import Finding, PreflightReport
from hanlm.stages import preflight as preflight_stage
from hanlm.stages.rundir import load_run_config

# Small, quick measurements; a checkpoint interval long enough for any healthy disk; the MFU a
# tiny model gets on a CPU; a throughput floor that a busy shared test disk still clears.
SETTINGS = {
    **TINY_PRETRAIN,
    "checkpoint.every": 1000,
    "plan.mfu": 0.05,
    "preflight.min_write_mb_s": 10,
    "preflight.storage_mb": 8,
    "preflight.fsync_probes": 3,
    "preflight.collective_mb": 1,
    "preflight.collective_iters": 3,
    "preflight.matmul_seconds": 0.1,
    "preflight.data_seconds": 0.1,
    "preflight.timeout_s": 60,
}


@pytest.fixture
def run_dir(demo_run, tmp_path):
    return copy_data_run(demo_run, tmp_path / "run")


@pytest.fixture(autouse=True)
def alone(monkeypatch):
    """In-process checks run as one process, whatever launched pytest."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("SLOW_DISK_S", "FREE_BYTES", "COLLECTIVE_ZEROS"):
        monkeypatch.delenv(f"HANLM_FAULT_{name}", raising=False)


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def check(run_dir, **extra):
    cfg = load_run_config(run_dir, values={**SETTINGS, **extra})
    return preflight_stage.check(cfg, run_dir)


def failures(report: PreflightReport, check_name: str) -> list[Finding]:
    return [f for f in report.findings if f.check == check_name and f.severity == verdict.FAIL]


def saved(run_dir) -> PreflightReport:
    return PreflightReport.read(run_dir / "preflight" / PreflightReport.FILE)


def judged(cfg, report: dict) -> PreflightReport:
    """A report (as its JSON) judged again, read back as the type a check returns."""
    verdict.judge(cfg, report)
    return PreflightReport.model_validate(report)


# -- one process ------------------------------------------------------------------------------


def test_healthy_single_process_is_go(run_dir, cli):
    result = cli("preflight", "--run", run_dir, "--json", *settings_args(SETTINGS))
    assert result.code == 0, result.err
    assert "GO" in result.err and "NO-GO" not in result.err
    report = PreflightReport.model_validate(json.loads(result.out))
    assert report == saved(run_dir) and report.verdict == "GO" and report.go
    rank = report.ranks[0]
    cpu = rank.device_list()[0]
    assert cpu["type"] == "cpu" and cpu["matmul_flops"] > 1e8
    storage = rank.storage
    assert storage["read_back_ok"] and storage["write_mb_s"] > 0 and storage["fsync_ms_max"] > 0
    assert storage["bytes_written"] >= 8e6
    assert storage["probe_dir"] == str(run_dir)  # checkpoints/ does not exist yet: its parent
    assert not list(run_dir.glob(".hanlm-preflight-*"))  # the scratch folder is gone
    assert not (run_dir / "pretrain").exists()
    assert rank.data["tokens_per_s"] > 0
    proj = report.projection
    assert proj["compute_s"] > 0 and proj["checkpoint_bytes"] > 0 and proj["save_s"] > 0
    assert proj["checkpoint_interval_s"] == pytest.approx(1000 * proj["compute_s"])
    notes = [f for f in report.findings if f.check == "collectives"]
    assert notes and notes[0].severity == verdict.NOTE  # one process: not measured


def test_full_checkpoint_disk_is_no_go(run_dir, monkeypatch):
    monkeypatch.setenv("HANLM_FAULT_FREE_BYTES", "1000")
    report = check(run_dir)
    assert report.verdict == "NO-GO" and not report.go
    [full] = failures(report, "storage")
    assert "1e-06 GB free" in full.reason and "checkpoints need" in full.reason
    assert "keep_last" in full.fix
    assert saved(run_dir).verdict == "NO-GO"


def test_slow_disk_is_no_go_with_throughput_and_save_time(run_dir, monkeypatch):
    monkeypatch.setenv("HANLM_FAULT_SLOW_DISK_S", "0.5")
    report = check(run_dir, **{"checkpoint.every_minutes": 0.005})  # a save every 0.3 s
    reasons = " | ".join(f.reason for f in failures(report, "storage"))
    assert report.verdict == "NO-GO"
    assert "MB/s with fsync" in reasons  # 2 blocks of 4 MB at 0.5 s each: < 10 MB/s
    assert "a checkpoint save would take" in reasons  # the save cannot keep up
    assert report.projection["checkpoint_interval_s"] == pytest.approx(0.3)
    storage = report.ranks[0].storage
    assert storage["fsync_ms_median"] >= 500
    assert any("faster disk" in f.fix or "NVMe" in f.fix for f in failures(report, "storage"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_checkpoint_folder_is_no_go(run_dir):
    folder = run_dir / "pretrain" / "checkpoints"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    try:
        report = check(run_dir)
    finally:
        folder.chmod(0o755)
    [failure] = failures(report, "storage")
    assert "not writable" in failure.reason and "chmod" in failure.fix


def test_unwritable_checkpoint_folder_is_no_go(run_dir, tmp_path, cli):
    """A path that cannot hold a folder at all (under a file): fails for root too."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    args = ["preflight", "--run", run_dir, "--checkpoint-dir", blocker / "ckpt"]
    result = cli(*args, *settings_args(SETTINGS))
    assert result.code == exit_status.HOST_REJECTED
    [failure] = failures(saved(run_dir), "storage")
    assert "not writable" in failure.reason and "--checkpoint-dir" in failure.fix
    assert "NO-GO" in result.err


def test_missing_peer_fails_within_the_timeout_naming_the_address(run_dir, monkeypatch, cli):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**env, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    start = time.perf_counter()
    without_timeout = {k: v for k, v in SETTINGS.items() if k != "preflight.timeout_s"}
    result = cli("preflight", "--run", run_dir, "--timeout", "2", *settings_args(without_timeout))
    assert time.perf_counter() - start < 60
    assert result.code == exit_status.HOST_REJECTED
    assert f"127.0.0.1:{port}" in result.err
    [failure] = failures(saved(run_dir), "rendezvous")
    assert f"127.0.0.1:{port}" in failure.reason and "--rdzv-endpoint" in failure.fix


def test_slow_network_is_no_go_with_a_fix_per_parallel_mode(run_dir):
    """Bus bandwidth too low for the planned model: communication exceeds compute."""
    report = check(run_dir).to_json()
    slow = {"busbw_gbs": 1e-6, "correct": True, "all_zero": False}
    for mode, words in (("ddp", "gradient accumulation"), ("fsdp", "micro_batch")):
        two_ranks = {**report, "world_size": 2, "expected_world_size": 2, "findings": []}
        rank = {**report["ranks"][0]}
        rank["collectives"] = {op: dict(slow) for op in collectives.OPERATIONS}
        two_ranks["ranks"] = [rank, {**rank, "rank": 1, "storage": None}]
        cfg = load_run_config(run_dir, values={**SETTINGS, "parallel.mode": mode})
        [comm] = failures(judged(cfg, two_ranks), "communication")
        assert comm.reason.startswith(mode.upper()) and words in comm.fix
        assert "NCCL_P2P_DISABLE=1" in comm.fix


def gpu(name: str, cc: tuple[int, int], catalogue: str, peak_tflops: float, tflops: float) -> dict:
    """What devices.probe_cuda reports for one GPU (no GPU is needed to judge it)."""
    return {
        "type": "cuda",
        "index": 0,
        "name": name,
        "memory_gb": 80.0,
        "compute_capability": list(cc),
        "bf16": cc >= (8, 0),
        "fp8": cc >= (8, 9),
        "driver": "570.1",
        "cuda_runtime": "12.8",
        "catalogue": catalogue,
        "peak_bf16_flops": peak_tflops * 1e12,
        "peak_fp8_flops": None,
        "matmul_flops": tflops * 1e12,
        "matmul_fraction": tflops / peak_tflops,
    }


def test_gpu_findings_fp8_capability_and_slow_matmul(run_dir):
    report = check(run_dir).to_json()
    a100 = gpu("NVIDIA A100-SXM4-80GB", (8, 0), "a100-80gb", 312, 40)
    h100 = gpu("NVIDIA H100 80GB HBM3", (9, 0), "h100", 989.4, 700)
    report["ranks"][0]["devices"] = {"count": 2, "devices": [a100, h100]}
    report["findings"] = []
    cfg = load_run_config(run_dir, values={**SETTINGS, "precision.mode": "fp8"})
    report = judged(cfg, report)
    reasons = [f.reason for f in failures(report, "devices")]
    assert any("compute capability 8.0: no FP8" in r for r in reasons)
    assert any("reached 40 of 312 dense BF16 TFLOPS" in r for r in reasons)
    assert len(reasons) == 2  # the H100 is fine
    mixed = [f for f in report.findings if f.severity == verdict.WARN]
    assert any("mixed devices" in f.reason for f in mixed)
    assert report.projection["peak_flops"] == 312e12  # the A100 sets the pace, in BF16


def test_stage_stops_the_pipeline_on_no_go_and_reuses_a_go(run_dir, monkeypatch):
    cfg = load_run_config(run_dir, values=SETTINGS)
    first = run_stage("preflight", cfg, run_dir)
    assert isinstance(first, PreflightReport) and first.verdict == "GO"
    again = run_stage("preflight", cfg, run_dir)
    assert again.created_at == first.created_at  # same settings and host: reused

    monkeypatch.setenv("HANLM_FAULT_FREE_BYTES", "0")
    assert run_stage("preflight", cfg, run_dir).created_at == first.created_at
    with pytest.raises(UserError, match=r"NO-GO: storage: .* GB free") as err:
        run_stage("preflight", cfg, run_dir, force=True)
    assert "keep_last" in err.value.fix and "fail_on_no_go" in err.value.fix
    lenient = load_run_config(run_dir, values={**SETTINGS, "preflight.fail_on_no_go": False})
    assert run_stage("preflight", lenient, run_dir).verdict == "NO-GO"


def test_bad_settings_are_user_errors(run_dir, cli):
    assert_user_error(
        cli("preflight", "--run", run_dir, "--set", "preflight.storage_mb=0"), "storage_mb"
    )
    assert_user_error(cli("preflight", "--run", run_dir, "--set", "preflight.nope=1"), "nope")


def test_bus_bandwidth_factors_follow_nccl_tests():
    assert collectives.bus_factor("all_reduce", 2) == 1.0
    assert collectives.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert collectives.bus_factor("all_gather", 8) == collectives.bus_factor("reduce_scatter", 8)
    assert collectives.bus_factor("reduce_scatter", 4) == 0.75


# -- two processes under torchrun (gloo) ------------------------------------------------------


def torchrun(run_dir, **fault_env) -> tuple[subprocess.CompletedProcess, PreflightReport]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **fault_env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "hanlm", "preflight", "--run-dir", str(run_dir), *settings_args(SETTINGS)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    return result, saved(run_dir)


@pytest.mark.slow
def test_two_ranks_with_zeroed_collectives_is_no_go(run_dir):
    result, report = torchrun(run_dir, HANLM_FAULT_COLLECTIVE_ZEROS="1")
    assert result.returncode == 1
    assert report.verdict == "NO-GO"
    [failure] = failures(report, "collectives")
    assert failure.reason == "all-reduce, all-gather, reduce-scatter returned zeros on rank 1 " + (
        f"({report.ranks[1].host})"
    )
    assert "NCCL_P2P_DISABLE=1" in failure.fix
    assert "zeros on rank 1" in result.stderr
    assert report.world_size == 2 and len(report.hosts) == 1
    assert report.ranks[0].storage is not None and report.ranks[1].storage is None  # one a host
    assert [f.check for f in report.findings if f.severity == "fail"] == ["collectives"]
    # the report card shows what was measured, the collectives with the rest
    from hanlm.report.plan_section import preflight_section
    from hanlm.stages.report import run_files
    from hanlm.stages.rundir import RunDir

    card = preflight_section(run_files(RunDir(run_dir)))
    busbw = report.ranks[0].collectives["reduce_scatter"]["busbw_gbs"]
    assert "| collectives | all-reduce " in card and f"reduce-scatter {busbw:.3g} GB/s" in card
    assert "over 2 ranks" in card
