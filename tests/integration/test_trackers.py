"""Experiment trackers: TensorBoard, trackio (local database) and W&B (offline) hold what
metrics.jsonl holds, a resumed training continues the same tracker runs, and a tracker that
cannot start is a UserError before any training.

Nothing reaches the network: trackio writes to a session folder (TRACKIO_DIR is read when trackio
is imported), W&B runs offline with its config and cache folders under tmp, without API key.
"""

import json
import os
import struct
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_PRETRAIN, assert_user_error, copy_data_run, metrics
from hanlm.config import load_config
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages import preflight as preflight_stage
from hanlm.stages.rundir import load_run_config
from hanlm.train import trackers
from hanlm.train.build import Components

# not imported here: trackio reads TRACKIO_DIR when it is imported (tracker_home sets it)
pytestmark = pytest.mark.skipif(
    not all(trackers.installed(m) for m in ("trackio", "wandb", "tensorboard")),
    reason="the trackers' extras are not installed (pip install 'hanlm[dev]')",
)

WANDB_ENV = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL")


@pytest.fixture(scope="module")
def tracker_home(tmp_path_factory):
    """Folders for trackio and W&B, set before either is imported, restored afterwards."""
    home = tmp_path_factory.mktemp("trackers")
    values = {
        "TRACKIO_DIR": str(home / "trackio"),
        "WANDB_CONFIG_DIR": str(home / "wandb-config"),
        "WANDB_CACHE_DIR": str(home / "wandb-cache"),
        "WANDB_DATA_DIR": str(home / "wandb-data"),
        "WANDB_SILENT": "true",
        "NETRC": str(home / "no-netrc"),  # no W&B key found in the user's ~/.netrc
    }
    if "trackio" in sys.modules:
        from trackio import utils

        assert Path(values["TRACKIO_DIR"]) == utils.TRACKIO_DIR, "trackio imported elsewhere"
    saved = {k: os.environ.get(k) for k in [*values, *WANDB_ENV]}
    os.environ.update(values)
    for name in WANDB_ENV:
        os.environ.pop(name, None)
    yield home
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    import wandb

    wandb.teardown()  # the wandb-core service this process started


@pytest.fixture
def run_dir(demo_run, tmp_path):
    return copy_data_run(demo_run, tmp_path / "run")


def train(run_dir, **extra):
    stop = extra.pop("stop_after_steps", None)
    cfg = load_run_config(run_dir, values={**TINY_PRETRAIN, **extra})
    return run_stage("pretrain", cfg, run_dir, stop_after_steps=stop)


def logged(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl as the trackers should hold it: step -> the numbers of that step."""
    out: dict[int, dict[str, float]] = {}
    for record in metrics(run_dir):
        out.setdefault(record["step"], {}).update(trackers.loggable(record))
    return out


# --- reading back what each tracker stored ---------------------------------------------------


def tensorboard_scalars(folder: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    out: dict[int, dict[str, float]] = {}
    for key in events.Tags()["scalars"]:
        for event in events.Scalars(key):
            out.setdefault(event.step, {})[key] = event.value
    return out


def tensorboard_text(folder: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return events.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def trackio_logs(project: str, name: str) -> tuple[dict[int, dict[str, float]], dict]:
    from trackio.sqlite_storage import SQLiteStorage

    out: dict[int, dict[str, float]] = {}
    for row in SQLiteStorage.get_logs(project, name):
        values = {k: v for k, v in row.items() if k not in ("step", "timestamp")}
        out.setdefault(row["step"], {}).update(values)
    return out, SQLiteStorage.get_run_config(project, name)


def wandb_records(path: Path):
    """The records of a W&B transaction log (run-ID.wandb): a 7-byte header (":W&B", magic,
    version), then LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header
    (checksum, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, header = 32768, 7
    pos, pending = 7, b""
    while pos + header <= len(data):
        room = block - pos % block
        if room < header:  # the block's trailer
            pos += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if kind == 0:  # zero padding up to the next block
            pos += room
            continue
        chunk = data[pos + header : pos + header + length]
        pos += header + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _items(items) -> dict:
    """{key: value} of W&B's protobuf items (a key, or its parts in nested_key)."""
    return {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}


def finished_wandb_logs(folder: Path, timeout_s: float = 60) -> list[list]:
    """The records of each offline W&B run under `folder`, once each ends with its exit record
    (wandb-core writes the log after run.finish() returns)."""
    deadline = time.monotonic() + timeout_s
    while True:
        paths = sorted((folder / "wandb").glob("offline-run-*/run-*.wandb"))
        logs = [list(wandb_records(path)) for path in paths]
        if all(log and log[-1].WhichOneof("record_type") == "exit" for log in logs):
            return logs
        assert time.monotonic() < deadline, f"a W&B run under {folder} has no exit record"
        time.sleep(0.1)


def wandb_run(folder: Path) -> tuple[set[str], dict[int, dict[str, float]], dict]:
    """(the run ids, step -> values, the config) of the offline W&B runs under `folder`."""
    ids, history, config = set(), {}, {}
    for log in finished_wandb_logs(folder):
        for record in log:
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                config.update(_items(record.run.config.update))
            elif kind == "history":
                row = _items(record.history.item)
                values = {k: v for k, v in row.items() if not k.startswith("_")}
                history.setdefault(record.history.step.num, {}).update(values)
    return ids, history, config


def close(got: dict, expected: dict, rel: float = 0.0) -> bool:
    """Same steps, same keys, same values (to `rel`; NaN equals NaN)."""
    if sorted(got) != sorted(expected):
        return False
    for step, values in expected.items():
        if sorted(got[step]) != sorted(values):
            return False
        for key, value in values.items():
            if value != value:
                if got[step][key] == got[step][key]:
                    return False
            elif got[step][key] != pytest.approx(value, rel=rel, abs=0):
                return False
    return True


# --- the trackers against metrics.jsonl ------------------------------------------------------


def test_every_tracker_holds_metrics_jsonl_and_resume_continues_the_same_runs(
    tracker_home, run_dir
):
    project = f"hanlm-test-{run_dir.parent.name}"  # trackio's database is per project
    chosen = {
        "logging.trackers": ["tensorboard", "trackio", "wandb"],
        "logging.trackio.project": project,
        "logging.wandb.project": project,
        "logging.wandb.mode": "offline",
        "checkpoint.every": 2,
        "pretrain.max_steps": 4,
        "logging.eval_every": 2,
    }
    first = train(run_dir, stop_after_steps=2, **chosen)
    assert first.step == 2 and not first.completed
    stage = run_dir / "pretrain"
    state = json.loads((stage / "trackers.json").read_text())
    second = train(run_dir, **chosen)
    assert second.completed
    expected = logged(run_dir)
    assert sorted(expected) == [1, 2, 3, 4] and "val_loss" in expected[4]

    # the same tracker runs, continued
    assert json.loads((stage / "trackers.json").read_text()) == state
    ids, history, config = wandb_run(stage)
    assert ids == {state["wandb"]["id"]}
    assert len(list((stage / "wandb").glob("offline-run-*"))) == 2  # one per start, one id
    assert close(history, expected, rel=1e-12)
    assert config["pretrain"]["max_steps"] == 4 and config["logging"]["trackers"] == [
        "tensorboard",
        "trackio",
        "wandb",
    ]

    trackio_history, trackio_config = trackio_logs(project, state["trackio"]["name"])
    assert state["trackio"]["name"] == "run-pretrain"  # the run directory's name, the stage
    assert close(trackio_history, expected, rel=1e-12)
    assert trackio_config["pretrain"]["max_steps"] == 4
    assert trackio_config["_Group"] == "run"

    # TensorBoard stores float32
    assert close(tensorboard_scalars(stage / "tensorboard"), expected, rel=1e-6)
    text = tensorboard_text(stage / "tensorboard", "config/text_summary")
    assert '"max_steps": 4' in text


def test_a_failed_training_finishes_its_tracker_runs_as_failed(tracker_home, run_dir, monkeypatch):
    monkeypatch.setenv("HANLM_FAULT_WRITE_ERRORS", "ENOSPC:100")  # every checkpoint write fails
    settings = {
        "logging.trackers": ["tensorboard", "wandb"],
        "logging.wandb.mode": "offline",
        "pretrain.max_steps": 2,
        "checkpoint.every": 0,
        "checkpoint.retries": 0,
        "checkpoint.async_save": False,
    }
    with pytest.raises(UserError, match="could not be written"):
        train(run_dir, **settings)
    stage = run_dir / "pretrain"
    (log,) = finished_wandb_logs(stage)
    assert log[-1].exit.exit_code == 1  # finished, as failed
    _, history, _ = wandb_run(stage)
    assert close(history, logged(run_dir), rel=1e-12)
    assert close(tensorboard_scalars(stage / "tensorboard"), logged(run_dir), rel=1e-6)


def test_a_tracker_that_fails_during_training_is_dropped_and_the_others_go_on(
    tracker_home, tmp_path, capsys
):
    cfg = load_config(
        values={"logging.trackers": ["tensorboard", "wandb"], "logging.wandb.mode": "offline"}
    )
    folder = tmp_path / "run" / "pretrain"
    setup = trackers.setup_for(cfg.logging, "pretrain", folder, {"seed": 1})
    opened = trackers.open_trackers(setup, folder, start_step=0)
    opened.log({"step": 1, "loss": 2.5})
    import wandb  # deferred: imported once tracker_home has set W&B's folders

    wandb.finish()  # the current W&B run, finished behind hanlm's back: its log now raises
    opened.log({"step": 2, "loss": 2.0})
    assert "tracker wandb failed and is dropped" in capsys.readouterr().err
    opened.log({"step": 3, "loss": 1.5})
    opened.close()
    assert tensorboard_scalars(folder / "tensorboard") == {
        1: {"loss": 2.5},
        2: {"loss": 2.0},
        3: {"loss": 1.5},
    }
    _, history, _ = wandb_run(folder)
    assert history == {1: {"loss": 2.5}}


def test_default_is_tensorboard_when_installed_and_an_empty_list_is_none(
    tracker_home, run_dir, monkeypatch
):
    cfg = load_config(values={})
    assert cfg.logging.trackers is None
    assert trackers.chosen(cfg.logging) == ["tensorboard"]
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    assert trackers.chosen(cfg.logging) == []
    monkeypatch.undo()
    train(run_dir, **{"pretrain.max_steps": 1, "logging.trackers": []})
    stage = run_dir / "pretrain"
    assert not (stage / "tensorboard").exists() and not (stage / "trackers.json").exists()
    assert sorted(logged(run_dir)) == [1]


def test_sft_sends_its_records_to_the_trackers_as_run_sft(tracker_home, run_dir):
    project = f"hanlm-sft-{run_dir.parent.name}"
    shared = {"logging.trackers": ["trackio"], "logging.trackio.project": project}
    train(run_dir, **{"pretrain.max_steps": 1, **shared})
    cfg = load_run_config(
        run_dir,
        values={
            **TINY_PRETRAIN,
            **shared,
            "sft.seq_len": 128,
            "sft.micro_batch": 2,
            "sft.batch_rows": 2,
            "sft.max_steps": 2,
            "sft.compare": [],  # no compared variant: one SFT
            "sft.heldout": 2,
            "sft.closure_max_tokens": 4,
            "sft.logging.log_every": 1,
        },
    )
    run_stage("sft", cfg, run_dir)
    records: dict[int, dict[str, float]] = {}
    for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["step"], {}).update(trackers.loggable(record))
    assert sorted(records) == [1, 2]
    state = json.loads((run_dir / "sft" / "trackers.json").read_text())
    assert state["trackio"]["name"] == "run-sft"
    history, config = trackio_logs(project, "run-sft")
    assert close(history, records, rel=1e-12)
    assert config["sft"]["max_steps"] == 2 and config["_Group"] == "run"


def test_sft_logs_under_its_own_name_with_its_cadence_and_the_shared_trackers():
    cfg = load_config(
        values={
            "logging.trackers": ["wandb"],
            "logging.name": "ko-small",
            "logging.log_every": 7,
            "sft.logging.log_every": 3,
        }
    )
    sft, pre = Components.sft(cfg), Components.pretraining(cfg)
    assert (sft.logging.log_every, sft.logging.trackers, sft.stage) == (3, ["wandb"], "sft")
    assert (pre.logging.log_every, pre.stage) == (7, "pretrain")
    setup = trackers.setup_for(sft.logging, sft.stage, Path("/runs/x/sft"), sft.config)
    assert (setup.name, setup.run_name) == ("ko-small-sft", "ko-small")
    assert setup.config["sft"]["logging"]["log_every"] == 3
    unnamed = cfg.logging.model_copy(update={"name": None})
    assert trackers.setup_for(unnamed, "sft", Path("/runs/x/sft"), {}).name == "x-sft"


# --- refused at the start ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trackio", "wandb", "tensorboard"])
def test_a_tracker_not_installed_is_refused_before_training(
    tracker_home, run_dir, cli, monkeypatch, name
):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` fails as if not installed
    result = cli(
        "pretrain", "--run-dir", run_dir, "--max-steps", "2", "--tracker", name,
        "--wandb-mode", "offline",
    )  # fmt: skip
    assert_user_error(result, f"hanlm[{name}]", "logging.trackers")
    assert not (run_dir / "pretrain" / "checkpoints").exists()
    assert not (run_dir / "pretrain" / "metrics.jsonl").exists()


def test_wandb_online_without_a_key_is_refused_before_training(tracker_home, run_dir, cli):
    result = cli("pretrain", "--run-dir", run_dir, "--max-steps", "2", "--tracker", "wandb")
    assert_user_error(result, "wandb login", "WANDB_API_KEY", "offline")
    assert not (run_dir / "pretrain" / "checkpoints").exists()


def test_a_wandb_key_that_cannot_be_one_is_refused(tracker_home, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    cfg = load_config(values={"logging.trackers": ["wandb"]})
    with pytest.raises(UserError, match="wandb login --relogin"):
        trackers.check(cfg.logging)


def test_the_pipeline_checks_trackers_before_the_data_stages(tracker_home, tmp_path, cli):
    result = cli("run", "--run-dir", tmp_path / "run", "--set", 'logging.trackers=["wandb"]')
    assert_user_error(result, "wandb login")
    assert not (tmp_path / "run" / "corpus").exists()


def test_preflight_says_no_go_for_a_tracker_that_cannot_start(tracker_home, run_dir):
    quick = {  # small measurements: only the trackers' finding matters here
        "preflight.storage_mb": 1,
        "preflight.fsync_probes": 1,
        "preflight.matmul_seconds": 0.05,
        "preflight.data_seconds": 0.05,
        "preflight.min_write_mb_s": 0.1,
    }
    cfg = load_run_config(run_dir, values={**TINY_PRETRAIN, **quick, "logging.trackers": ["wandb"]})
    report = preflight_stage.check(cfg, run_dir)
    refused = [f for f in report.findings if f.check == "trackers"]
    assert report.verdict == "NO-GO" and len(refused) == 1
    assert refused[0].severity == "fail" and "wandb login" in refused[0].fix
    cfg = load_run_config(
        run_dir, values={**TINY_PRETRAIN, **quick, "logging.trackers": ["tensorboard"]}
    )
    report = preflight_stage.check(cfg, run_dir)
    assert report.ranks[0].trackers == {"trackers": ["tensorboard"]}
    assert not [f for f in report.findings if f.check == "trackers"]


def test_a_trackio_space_without_a_hugging_face_token_is_refused(tracker_home, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tracker_home / "no-hf-home"))
    monkeypatch.setenv("HF_TOKEN_PATH", str(tracker_home / "no-hf-token"))
    cfg = load_config(
        values={"logging.trackers": ["trackio"], "logging.trackio.space_id": "someone/runs"}
    )
    with pytest.raises(UserError, match="hf auth login"):
        trackers.check(cfg.logging)


def test_tracker_settings_are_checked(tracker_home):
    with pytest.raises(UserError, match="named twice"):
        load_config(values={"logging.trackers": ["wandb", "wandb"]})
    with pytest.raises(UserError, match=r"logging\.trackers"):
        load_config(values={"logging.trackers": ["mlflow"]})
    with pytest.raises(UserError, match=r"logging\.wandb\.mode"):
        load_config(values={"logging.wandb.mode": "dryrun"})
