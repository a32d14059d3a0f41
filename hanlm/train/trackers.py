"""Experiment trackers: TensorBoard, trackio and Weights & Biases receive what goes to
metrics.jsonl.

[logging] trackers names them (unset: TensorBoard when it is installed). `check` runs before
training, on every rank: a tracker that is not installed, W&B online without credentials, or a
trackio Space without a Hugging Face token is a UserError at the start, not a crash after an
hour. `open_trackers` starts them on rank 0 when the loop starts: each gets the resolved config
once, then every metrics record (same keys, same step; a value that is not a number, such as an
unknown MFU, is left out), and is finished when the loop ends, as failed when it failed.

Resume: the ids of the tracker runs are kept in the stage folder (trackers.json, next to
metrics.jsonl); a resumed training continues the same W&B run (id, resume="allow") and the same
trackio run (its name, resume="allow"); TensorBoard drops the events past the resumed step
(purge_step). W&B and trackio keep the records a crashed run wrote after its last checkpoint:
W&B ignores steps it has seen, trackio shows them twice (it cannot delete part of a run).

A tracker that fails while training runs is dropped with a warning: metrics.jsonl holds
everything, and an hour of training is not lost to a tracker's network.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from hanlm.config import LoggingSection
from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.files import atomic_write_text

# tracker -> (the module it needs, the extra that installs it)
REQUIREMENTS = {
    "tensorboard": ("tensorboard", "hanlm[tensorboard]"),
    "trackio": ("trackio", "hanlm[trackio]"),
    "wandb": ("wandb", "hanlm[wandb]"),
}
STATE_FILE = "trackers.json"
WANDB_FINISH_TIMEOUT_S = 120.0  # then the rest stays on disk for `wandb sync`


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def chosen(section: LoggingSection) -> list[str]:
    """The trackers a training opens: the configured ones, else TensorBoard if installed."""
    if section.trackers is not None:
        return list(section.trackers)
    return ["tensorboard"] if installed("tensorboard") else []


def check(section: LoggingSection) -> None:
    """Raise a UserError for a chosen tracker that cannot start; nothing is opened."""
    for name in chosen(section):
        module, extra = REQUIREMENTS[name]
        if not installed(module):
            raise UserError(
                f"the tracker {name!r} is not installed (no module {module!r})",
                where="logging.trackers",
                fix=f"pip install '{extra}', or take {name!r} out of logging.trackers",
            )
    names = chosen(section)
    if "wandb" in names and section.wandb.mode == "online" and not _wandb_logged_in():
        raise UserError(
            "Weights & Biases is online but has no API key on this machine",
            where="logging.wandb.mode",
            fix="run `wandb login` (or set WANDB_API_KEY), or set logging.wandb.mode = "
            '"offline" and upload later with `wandb sync`',
        )
    if "trackio" in names and section.trackio.space_id and not _hf_token():
        raise UserError(
            f"trackio logs to the Space {section.trackio.space_id!r} but no Hugging Face token "
            "is set on this machine",
            where="logging.trackio.space_id",
            fix="run `hf auth login` (or set HF_TOKEN), or unset logging.trackio.space_id to "
            "log to the local database",
        )


def _wandb_logged_in() -> bool:
    """Whether W&B finds credentials (WANDB_API_KEY, .netrc, its settings); no network."""
    # deferred: wandb is optional and slow to import
    import wandb

    try:
        return bool(wandb.login(verify=False, prompt=False))
    except wandb.errors.Error as e:  # e.g. a WANDB_API_KEY that cannot be a key
        raise UserError(
            f"Weights & Biases cannot use its credentials: {e}",
            where="logging.wandb",
            fix="run `wandb login --relogin` (or fix WANDB_API_KEY), or set logging.wandb.mode "
            '= "offline"',
        ) from e


def _hf_token() -> str | None:
    # deferred: huggingface_hub is slow to import and only a trackio Space needs it
    from huggingface_hub import get_token

    return get_token()


@dataclass(frozen=True)
class TrackerSetup:
    """What the trackers of one training need: the [logging] section, the stage, the run's
    name and the resolved config to record."""

    section: LoggingSection
    stage: str  # "pretrain" or "sft": the run's job type and name suffix
    run_name: str  # the group; the tracker run is RUN_NAME-STAGE
    config: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.run_name}-{self.stage}"


def setup_for(section: LoggingSection, stage: str, folder: Path, config: dict) -> TrackerSetup:
    """The tracker setup of a training writing into `folder` (RUN/pretrain, RUN/sft): named after
    logging.name, else the run directory."""
    run_name = section.name or Path(folder).resolve().parent.name
    return TrackerSetup(section, stage, run_name, config)


def loggable(record: dict) -> dict[str, float]:
    """The record's values a tracker can plot: its numbers (NaN included), without the step."""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class Trackers:
    """The open trackers of one training (rank 0)."""

    def __init__(self, opened: dict[str, object]):
        self._open = opened

    def log(self, record: dict) -> None:
        values, step = loggable(record), record["step"]
        for name, tracker in list(self._open.items()):
            try:
                tracker.log(values, step)
            except Exception as e:  # a tracker's failure must not end the training
                warn(
                    f"tracker {name} failed and is dropped ({type(e).__name__}: {e}); "
                    "metrics.jsonl keeps every record"
                )
                self._close_one(name, tracker, "failed")

    def close(self, outcome: str = "finished") -> None:
        """Finish every tracker: outcome is "finished", "failed" or "preempted"."""
        for name, tracker in list(self._open.items()):
            self._close_one(name, tracker, outcome)

    def _close_one(self, name: str, tracker, outcome: str) -> None:
        self._open.pop(name, None)
        try:
            tracker.finish(outcome)
        except Exception as e:  # finishing is best effort: the training's outcome stands
            warn(f"tracker {name} did not finish cleanly ({type(e).__name__}: {e})")


def open_trackers(setup: TrackerSetup, folder: Path, *, start_step: int) -> Trackers:
    """Start the chosen trackers for a training writing into `folder`, continuing the runs in
    folder/trackers.json when it resumes (start_step > 0). A tracker that cannot start is a
    UserError, and the ones already started are finished."""
    folder = Path(folder)
    check(setup.section)
    state_path = folder / STATE_FILE
    previous = _read_state(state_path) if start_step > 0 else {}
    opened: dict[str, object] = {}
    state: dict[str, dict] = {}
    try:
        for name in chosen(setup.section):
            tracker, state[name] = _OPENERS[name](setup, folder, start_step, previous.get(name))
            opened[name] = tracker
    except BaseException:
        Trackers(opened).close("failed")
        raise
    if state:
        atomic_write_text(state_path, json.dumps(state, indent=2) + "\n")
    return Trackers(opened)


def _read_state(path: Path) -> dict:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _continues(previous: dict | None, **same) -> bool:
    """Whether the stored run can be continued: it exists and belongs to the same place."""
    return bool(previous) and all(previous.get(k) == v for k, v in same.items())


def _config_text(config: dict) -> str:
    return "```\n" + json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n```"


# --- TensorBoard ------------------------------------------------------------------------------


class _TensorBoard:
    def __init__(self, folder: Path, start_step: int, config: dict):
        # deferred: tensorboard is optional and slow to import
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events of a crashed run past the resumed step are not shown
        self.writer = SummaryWriter(str(folder), purge_step=start_step + 1 if start_step else None)
        self.writer.add_text("config", _config_text(config), start_step)

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a dashboard watching the run sees each line

    def finish(self, outcome: str) -> None:
        self.writer.close()


def _open_tensorboard(setup: TrackerSetup, folder: Path, start_step: int, previous):
    where = folder / "tensorboard"
    return _TensorBoard(where, start_step, setup.config), {"logdir": str(where)}


# --- trackio ----------------------------------------------------------------------------------


class _Trackio:
    def __init__(self, run):
        self.run = run

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def finish(self, outcome: str) -> None:
        self.run.finish()


def _open_trackio(setup: TrackerSetup, folder: Path, start_step: int, previous):
    # deferred: trackio is optional and slow to import
    import trackio

    trackio_cfg = setup.section.trackio
    resume = _continues(previous, project=trackio_cfg.project, space_id=trackio_cfg.space_id)
    name = previous["name"] if resume else setup.name
    if start_step > 0 and not resume:
        info(f"trackio: no run of project {trackio_cfg.project!r} to continue; a new run {name!r}")
    try:
        run = trackio.init(
            project=trackio_cfg.project,
            name=name,
            group=setup.run_name,
            space_id=trackio_cfg.space_id,
            config=setup.config,
            resume="allow" if resume else "never",
            embed=False,  # no dashboard server from a training
        )
    except Exception as e:  # trackio's errors: a bad project name, a Space it cannot reach
        raise UserError(
            f"trackio could not start the run ({type(e).__name__}: {e})",
            where="logging.trackio",
            fix="check logging.trackio.project and .space_id (and `hf auth login` for a Space)",
        ) from e
    return _Trackio(run), {
        "project": trackio_cfg.project,
        "space_id": trackio_cfg.space_id,
        "name": name,
    }


# --- Weights & Biases -------------------------------------------------------------------------


class _Wandb:
    def __init__(self, run):
        self.run = run

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def finish(self, outcome: str) -> None:
        if outcome == "preempted":
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if outcome == "finished" else 1)


def _open_wandb(setup: TrackerSetup, folder: Path, start_step: int, previous):
    # deferred: wandb is optional and slow to import
    import wandb

    wandb_cfg = setup.section.wandb
    where = Path(wandb_cfg.dir) if wandb_cfg.dir else folder
    where.mkdir(parents=True, exist_ok=True)
    resume = _continues(previous, project=wandb_cfg.project, entity=wandb_cfg.entity)
    if start_step > 0 and not resume:
        info(f"wandb: no run of project {wandb_cfg.project!r} to continue; a new run")
    try:
        run = wandb.init(
            project=wandb_cfg.project,
            entity=wandb_cfg.entity,
            name=setup.name,
            group=setup.run_name,
            job_type=setup.stage,
            id=previous["id"] if resume else None,  # None: W&B makes a new one
            resume="allow" if resume else None,
            mode=wandb_cfg.mode,
            dir=str(where),
            config=setup.config,
            settings=wandb.Settings(
                console="off",  # hanlm prints its own lines; the metrics are logged
                finish_timeout=WANDB_FINISH_TIMEOUT_S,
            ),
        )
    except Exception as e:  # wandb's errors: a refused key, no network, a bad entity
        raise UserError(
            f"Weights & Biases could not start the run ({type(e).__name__}: {e})",
            where="logging.wandb",
            fix="check `wandb login`, the network, logging.wandb.project and .entity, or set "
            'logging.wandb.mode = "offline"',
        ) from e
    state = {
        "project": wandb_cfg.project,
        "entity": wandb_cfg.entity,
        "id": run.id,
        "mode": wandb_cfg.mode,
    }
    return _Wandb(run), state


_OPENERS = {"tensorboard": _open_tensorboard, "trackio": _open_trackio, "wandb": _open_wandb}
