"""`hanlm launch --dry-run`: the SkyPilot task and the Slurm script it writes, checked by the
engines' own parsers; the cost it expects and the cost the hosts tried did cost; and every bad
input refused with exit status 2 and nothing written."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import assert_user_error
from hanlm import exit_status
from hanlm.config import Config
from hanlm.errors import UserError
from hanlm.launch import command, cost, skypilot, slurm
from hanlm.launch.cost import LaunchRecord
from hanlm.plan.recipe import plan_recipe
from hanlm.preflight.report import PreflightReport

FIELD = "ko-1.3b-8x5090"


def needs_skypilot() -> None:
    try:
        skypilot.sky_python()
    except UserError as e:
        pytest.skip(f"SkyPilot's parser checks the tasks: {e.what} (scripts/setup.sh --dev)")


@pytest.fixture
def field_inputs(tmp_path, monkeypatch) -> Path:
    """The field recipe's local files (benchmarks, SFT data) where it expects them."""
    monkeypatch.chdir(tmp_path)
    for name in [
        "benchmarks/kobest/BoolQ/test.tsv",
        "benchmarks/kobest/COPA/test.tsv",
        "benchmarks/kobest/HellaSwag/test.tsv",
        "benchmarks/kobest/SentiNeg/test.tsv",
        "benchmarks/kobest/WiC/test.tsv",
        "benchmarks/gsm8k-ko/test.jsonl",
        "sft/ko-chat.jsonl",
    ]:
        (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / name).write_text("x\n")
    return tmp_path


def test_skypilot_tasks_for_one_and_two_hosts_spot_and_on_demand(cli, field_inputs):
    """Four launches of the field recipe, each task accepted by SkyPilot's own parser."""
    needs_skypilot()
    written = {}
    for hosts in (1, 2):
        for market in ("--spot", "--no-spot"):
            run = field_inputs / f"run-{hosts}{market}"
            result = cli(
                "launch", "--config", FIELD, "--run-dir", run, "--dry-run", "--hosts", hosts,
                market, "--bucket", "s3://my-runs",
            )  # fmt: skip
            assert result.code == 0, result.err
            written[(hosts, market)] = run / "launch" / "task.yaml"
    for (hosts, market), path in written.items():  # what SkyPilot's parser made of each
        found = LaunchRecord.read(path.parent / "launch.json").validated
        assert found["num_nodes"] == hosts
        assert ("[Spot]" in found["resources"][0]) == (market == "--spot")
    task = yaml.safe_load(written[(2, "--spot")].read_text())
    assert task["resources"]["accelerators"] == "RTX5090:8"
    assert task["resources"]["job_recovery"] == {
        "strategy": "EAGER_NEXT_REGION",
        "max_restarts_on_errors": 3,
        "recover_on_exit_codes": [exit_status.STOPPED],
    }
    assert task["file_mounts"]["/hanlm-runs"] == {"source": "s3://my-runs", "mode": "MOUNT_CACHED"}
    assert task["envs"]["HANLM_RUN"] == "/hanlm-runs/run-2--spot"
    for variable in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES"):
        assert variable in task["run"]
    assert "hanlm[hf]==" in task["setup"]
    # the recipe the hosts read has the local files at the paths they are copied to
    recipe = (written[(2, "--spot")].parent / "recipe.toml").read_text()
    assert 'data = "/hanlm-inputs/' in recipe
    for remote, local in task["file_mounts"].items():
        if remote.startswith("/hanlm-inputs/"):
            assert Path(local).is_dir()
    record = LaunchRecord.read(written[(2, "--spot")].parent / "launch.json")
    assert record.dry_run and record.submitted is None and record.cost.market == "spot"


def test_slurm_script_parses_and_says_what_it_does(cli, field_inputs):
    run = field_inputs / "run"
    result = cli(
        "launch", "--config", FIELD, "--run-dir", run, "--dry-run", "--engine", "slurm",
        "--hosts", "2", "--partition", "gpu", "--time-limit-hours", "30",
    )  # fmt: skip
    assert result.code == 0, result.err
    script = (run / "launch" / "job.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(run / "launch" / "job.sbatch")]).returncode == 0
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-06:00:00",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        "--rdzv-backend c10d",
    ):
        assert line in script, line
    assert f"-eq {exit_status.HOST_REJECTED} ]" in script
    assert f"-eq {exit_status.STOPPED} ]" in script


def test_a_launch_that_rehearses_does_so_after_preflight_and_before_the_run(cli, field_inputs):
    """[launch] rehearse: on each host set, preflight, then `hanlm rehearse` on every rank, then
    the run; a failure of either ends the job with its status (69: another host set is tried);
    a job that resumes training does not rehearse again."""
    for engine, name in (("skypilot", "task.yaml"), ("slurm", "job.sbatch")):
        run = field_inputs / f"run-{engine}"
        extra = ["--partition", "gpu"] if engine == "slurm" else []
        result = cli("launch", "--config", FIELD, "--run-dir", run, "--dry-run", "--engine",
                     engine, "--rehearse", *extra)  # fmt: skip
        assert result.code == 0, result.err
        text = (run / "launch" / name).read_text()
        if engine == "skypilot":
            text = yaml.safe_load(text)["run"]
        preflight = text.index("--until preflight")
        rehearsal = text.index("rehearse --run-dir")
        assert preflight < rehearsal < text.index('--until "$HANLM_UNTIL"' if engine ==
                                                  "skypilot" else "--until report")  # fmt: skip
        assert 'if [ ! -e "$HANLM_RUN/pretrain/checkpoints/latest" ]' in text
        script = run / "launch" / "check.sh"
        script.write_text(text)
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    plain = field_inputs / "plain"
    assert cli("launch", "--config", FIELD, "--run-dir", plain, "--dry-run").code == 0
    assert "rehearse --run-dir" not in (plain / "launch" / "task.yaml").read_text()


def test_bad_launches_are_refused_with_nothing_written(cli, field_inputs, monkeypatch):
    cases = [
        (["--gpu", "cpu"], "a launch rents the GPUs"),
        (["--hosts", "2"], "need one run folder they all see"),
        (["--launch-until", "nowhere"], "is not a stage"),
        (["--set", 'sft.data="missing/chat.jsonl"'], "matches nothing here"),
    ]
    for i, (args, needle) in enumerate(cases):
        run = field_inputs / f"bad-{i}"
        result = cli("launch", "--config", FIELD, "--run-dir", run, "--dry-run", *args)
        assert_user_error(result, needle)
        assert not (run / "launch").exists(), args
    monkeypatch.setenv("HANLM_SKYPILOT_PYTHON", "/no/such/python")
    result = cli("launch", "--config", FIELD, "--run-dir", field_inputs / "r", "--dry-run")
    assert_user_error(result, "SkyPilot Python /no/such/python does not exist")


def test_skypilot_refusal_is_a_user_error(tmp_path):
    needs_skypilot()
    task = tmp_path / "task.yaml"
    task.write_text("nmu_nodes: 2\nrun: echo\n")
    with pytest.raises(UserError, match=r"SkyPilot refused the task: .*num_nodes"):
        skypilot.validate(task)


def test_expected_cost_adds_the_stated_allowances():
    cfg = Config.model_validate(
        {
            "plan": {"gpu": "rtx5090", "gpus": 8, "hosts": 1, "tokens": 22e9},
            "model": {"preset": "1.3b"},
            "launch": {"spot": True, "rejected_host_share": 0.5, "preemptions_per_day": 2.0},
        }
    )
    plan = plan_recipe(cfg)
    expected = cost.expected(cfg, plan)
    assert expected.price_per_gpu_hour == 0.69 and "RunPod" in expected.price_source
    hours = expected.training_hours + expected.data_hours
    assert expected.planned_gpu_hours == pytest.approx(hours * 8)
    preemptions = 2.0 * hours / 24
    assert expected.expected_preemptions == pytest.approx(preemptions)
    # half the hosts rejected: one rejected set per set rented, on every rent
    assert expected.expected_rejected_host_sets == pytest.approx(1 + preemptions)
    assert expected.rejected_gpu_hours == pytest.approx((1 + preemptions) * 0.25 * 8)
    assert expected.expected_cost == pytest.approx(expected.expected_gpu_hours * 0.69)
    on_demand = cost.expected(cfg.model_copy(update={"launch": cfg.launch.model_copy(
        update={"spot": False})}), plan)  # fmt: skip
    assert on_demand.price_per_gpu_hour == 1.22 and on_demand.expected_preemptions == 0


def _verdict(folder: Path, go: bool, started: datetime.datetime, minutes: float) -> None:
    report = PreflightReport(
        created_at=(started + datetime.timedelta(minutes=minutes)).isoformat(),
        world_size=8,
        expected_world_size=8,
        hosts=[f"host-{started.minute}"],
        rendezvous=None,
        checkpoint_dir="/ckpt",
        findings=[] if go else [{"check": "collectives", "severity": "fail", "reason": "zeros"}],
        ranks=[],
        verdict="GO" if go else "NO-GO",
        host_started_at=started.isoformat(),
    )
    report.keep_as_tried(folder / "preflight.json")


def test_spent_follows_each_host_set_from_start_to_verdict_or_to_the_next(tmp_path):
    t0 = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
    hour = datetime.timedelta(hours=1)
    _verdict(tmp_path, False, t0, 15)  # rejected after 15 minutes
    _verdict(tmp_path, True, t0 + hour, 10)  # accepted, preempted when the next set started
    _verdict(tmp_path, True, t0 + 4 * hour, 10)  # accepted, still running
    spent = cost.spent(
        tmp_path, price_per_gpu_hour=0.5, minutes_per_rejected_host=15,
        finished_at=t0 + 6 * hour,
    )  # fmt: skip
    assert [r["verdict"] for r in spent["host_sets"]] == ["NO-GO", "GO", "GO"]
    assert [r["gpu_hours"] for r in spent["host_sets"]] == pytest.approx([2.0, 24.0, 16.0])
    assert spent["rejected_gpu_hours"] == pytest.approx(2.0)
    assert spent["cost"] == pytest.approx(42 * 0.5)
    assert spent["host_sets"][0]["reasons"] == ["zeros"]


@pytest.mark.parametrize(
    ("codes", "first", "status"),
    [
        ([75, -15, 1], 1, exit_status.STOPPED),  # one stopped rank: the others followed it
        ([69, 69], 69, exit_status.HOST_REJECTED),
        ([2, -15], 2, exit_status.USER_ERROR),
        ([1, 2], 1, exit_status.FAILED),
        ([-9], -9, exit_status.FAILED),
    ],
)
def test_the_ranks_status_is_the_jobs(codes, first, status):
    assert exit_status.of_ranks(codes, first) == status


def test_slurm_time_limit_format():
    assert slurm.time_limit(0.01) == "0-00:01:00"
    assert slurm.time_limit(30) == "1-06:00:00"
    assert command.job_name(Path("/x/My Run_2")) == "hanlm-my-run-2"
    assert json.loads(json.dumps(slurm.time_limit(1.5))) == "0-01:30:00"


def test_a_local_snapshot_and_chat_sources_travel_to_the_hosts(tmp_path):
    """hf:FOLDER:CONFIG:SPLIT names a folder on this machine: the launch mounts the folder and
    the hosts' recipe names it where it lands, config and split kept; chat sources' files too."""
    from hanlm.config import load_config
    from hanlm.launch.command import remote_inputs

    snapshot = tmp_path / "fineweb-2"
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "data" / "train-0.parquet").write_bytes(b"")
    (tmp_path / "chat.jsonl").write_text("{}\n")
    cfg = load_config(values={
        "corpus.sources": [{"name": "web", "inputs": [f"hf:{snapshot}:kor_Hang:train",
                                                      "hf:someone/ko:train"]}],
        "sft.sources": [{"name": "chat", "inputs": [str(tmp_path / "chat.jsonl")]}],
    })  # fmt: skip
    remote, mounts = remote_inputs(cfg)
    local_snapshot, hub = remote.corpus.sources[0].inputs
    assert hub == "hf:someone/ko:train"  # the hosts read it from the Hub
    assert local_snapshot.startswith("hf:") and local_snapshot.endswith(":kor_Hang:train")
    folder = local_snapshot.removeprefix("hf:").removesuffix(":kor_Hang:train")
    assert mounts[folder] == str(snapshot)
    chat = remote.sft.sources[0].inputs[0]
    assert Path(mounts[str(Path(chat).parent)]) == tmp_path
