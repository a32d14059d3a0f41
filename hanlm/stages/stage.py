"""What a stage declares, and what it is handed when it runs.

A stage module ends with one `STAGE = Stage(...)`: its name, version, output folder, result type,
the settings it reads, the stages it reads from, and its functions: `build(ctx)`, which turns its
inputs into its outputs and returns its result (of the `Result` type it declares:
hanlm.results), and the optional hooks below. `hanlm.pipeline` does everything else once for all
of them: the fingerprint (from exactly the settings the stage declares it reads, the fingerprints
of the stages it reads from, its version and the identity of its inputs outside the run),
skipping a finished stage whose outputs are whole, the temporary folder renamed into place, the
completion marker, and which ranks run it under torchrun.

Every hook that takes the recipe gets the stage's declared view of it (`declared_view`): a
section it did not declare raises. The hooks:
  not_needed(cfg) -> str | None     why the stage has nothing to do for this recipe (its earlier
                                    output is then removed, so no later stage reads it)
  validate(cfg, run, options)       refuse bad input (a UserError) before anything is made,
                                    the demo world included
  uses_demo(cfg, options) -> bool   whether it reads the demo world
  inputs(cfg, run, options) -> Any  what it reads from outside the run folder (input files, a
                                    model folder), by identity, for its fingerprint
  damage(run) -> str | None         what is wrong with a finished output that would be reused
  always_builds(options) -> bool    the command asks for a build whatever is finished (one
                                    shard of a scan, a merge of the shards)
`options` are the command's own for the stage, an instance of the dataclass it declares
(`Stage.options`; NoOptions when its commands give none), made from `run_stage`'s keywords.
A stage that is the pipeline run again declares a `Rerun` instead of a build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hanlm.config import Config
from hanlm.errors import UserError
from hanlm.results import Result
from hanlm.stages.rundir import RunDir

# How a stage's output folder is written:
#   new_folder  build fills an empty temporary folder, renamed into place with the marker
#   in_place    build works in the folder itself (training: checkpoints to resume from); the
#               marker is removed before and written after
#   always      never skipped (the report only reads): no marker, no fingerprint
Writes = Literal["new_folder", "in_place", "always"]


def _never(*args: Any) -> bool:
    return False


def _nothing(*args: Any) -> None:
    return None


@dataclass(frozen=True)
class Rerun:
    """A stage that is the pipeline run again on a derived recipe, in a run folder of its own.
    `derive` gets the whole recipe (the derived one is the whole recipe, changed), and gives it
    with its folder; `stages` run there in order, each skipped when finished as the run's own
    are; `prepare(run, sub)` (rank 0, before them) readies the folder; `describe(sub)` is the
    line printed before them."""

    derive: Callable[[Config, RunDir], tuple[Config, RunDir]]
    stages: tuple[str, ...]
    prepare: Callable[[RunDir, RunDir], None]
    describe: Callable[[RunDir], str]


@dataclass(frozen=True)
class NoOptions:
    """The options of a stage whose commands give nothing of their own."""


@dataclass(frozen=True)
class Stage:
    """A stage's declaration. `reads` names config sections (`"tokenizer"`) or single fields
    (`"run.seed"`); every field of a named section is part of the fingerprint but those in
    `unfingerprinted` (dotted names of fields that change nothing the stage computes, such as a
    batch size of the encoding or how often it logs). `after` names the stages whose outputs it
    reads, in the pipeline's order. `version` changes when the stage's outputs change meaning:
    a folder made by another version is never reused silently. The hooks are the module
    docstring's."""

    name: str
    version: int
    output: Callable[[RunDir], Path]
    # the type of what build returns, kept in the output folder as `result.FILE` and read back
    # when the stage is skipped (None: its outputs are its files alone, as the demo world's)
    result: type[Result] | None
    build: Callable[[StageContext], Any] | None = None  # None only for a Rerun
    reads: tuple[str, ...] = ()
    unfingerprinted: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    writes: Writes = "new_folder"
    # a folder its jobs keep between runs to resume in: the pipeline makes it ready (ctx.work),
    # throws it away on bad input, and removes it once the stage is finished
    work: Callable[[RunDir], Path] | None = None
    all_ranks: bool = False  # under torchrun, every rank runs it (training, host checks)
    # it logs to [logging]'s trackers: the pipeline checks they can start (on every rank, before
    # the stage builds; and before the first stage of a pipeline that will reach it)
    logs_to_trackers: bool = False
    not_needed: Callable[[Config], str | None] = _nothing
    # the dataclass of the command's own settings for the stage, which run_stage's keywords make
    options: type = NoOptions
    validate: Callable[[Config, RunDir, Any], None] = _nothing
    uses_demo: Callable[[Config, Any], bool] = _never
    inputs: Callable[[Config, RunDir, Any], Any] = _nothing
    damage: Callable[[RunDir], str | None] = _nothing
    always_builds: Callable[[Any], bool] = _never
    rerun: Rerun | None = None
    # what the stage needs computed from sections it does not read whole, from the whole
    # recipe (the corpus: how far each source is read, from pretraining's budget): part of its
    # fingerprint, handed to build as ctx.derived, so the value and not the settings behind it
    # decide whether a finished output is reused
    derived: Callable[[Config], Any] | None = None

    def __post_init__(self) -> None:
        sections = {name.split(".")[0] for name in self.reads}
        for name in self.unfingerprinted:
            if name.split(".")[0] not in sections:
                raise ValueError(f"{self.name}: {name} is not in a section the stage reads")
        if (self.build is None) == (self.rerun is None):
            raise ValueError(f"{self.name}: a stage has a build or a Rerun, and only one")


@dataclass
class StageContext:
    """What `build` works with. `cfg` holds only the sections the stage declared: reading
    another is an error that names the missing declaration. `out` is the folder to write (a
    temporary one for `new_folder` stages). `options` are the command's own (e.g. pretraining's
    `stop_after_steps`)."""

    cfg: Config
    run: RunDir
    out: Path
    fingerprint: str
    force: bool
    options: Any = field(default_factory=NoOptions)  # the stage's own Stage.options
    derived: Any = None  # Stage.derived's value for the recipe
    # the folder its jobs resume in (Stage.work), made ready by the pipeline: emptied when forced
    # or made for other settings (None: the stage declares none)
    work: Path | None = None


@dataclass(frozen=True)
class Unfinished:
    """What `build` returns when it stopped before the end with something to say (training
    stopped after some steps, to resume): the stage is not marked finished, and the caller gets
    `summary` (of the stage's result type). A bare None says the same with nothing to report
    (jobs still on a cluster)."""

    summary: Result


@dataclass(frozen=True)
class NotNeeded:
    """What running a stage gives when it has nothing to do for the recipe, and why."""

    stage: str
    reason: str


@dataclass(frozen=True)
class OnRankZero:
    """What the other ranks get for a stage rank 0 ran alone while they waited: its result is
    rank 0's (in the stage's folder)."""

    stage: str


# what running a stage gives: its result (the declared type; a plain dict for a stage that
# declares none), or one of the above, or None when its jobs still run on a cluster
StageOutcome = Result | Unfinished | NotNeeded | OnRankZero | dict | None


class UndeclaredRead(AssertionError):
    """A stage read a config section it did not declare: its fingerprint would miss it."""


class _Undeclared:
    """Stands in for a config section a stage did not declare."""

    def __init__(self, stage: str, section: str, fields: frozenset[str] | None = None,
                 real: Any = None):  # fmt: skip
        self._stage, self._section, self._fields, self._real = stage, section, fields, real

    def __getattr__(self, name: str) -> Any:
        if self._fields is not None and name in self._fields:
            return getattr(self._real, name)
        what = f"[{self._section}]" if self._fields is None else f"{self._section}.{name}"
        raise UndeclaredRead(
            f"stage {self._stage} read {what} without declaring it in its Stage(reads=...): "
            "its fingerprint would not cover it"
        )


def declared_view(cfg: Config, stage: Stage) -> Config:
    """`cfg` with every section `stage` does not declare replaced by a guard that raises on use,
    so a stage cannot depend on a setting its fingerprint leaves out."""
    whole = {name for name in stage.reads if "." not in name}
    partial: dict[str, set[str]] = {}
    for name in stage.reads:
        if "." in name:
            section, field_name = name.split(".", 1)
            partial.setdefault(section, set()).add(field_name)
    update: dict[str, Any] = {}
    for section in type(cfg).model_fields:
        if section in whole:
            continue
        fields = frozenset(partial[section]) if section in partial else None
        update[section] = _Undeclared(stage.name, section, fields, getattr(cfg, section))
    return cfg.model_copy(update=update)


def _exclusions(names: tuple[str, ...]) -> dict[str, dict]:
    """Dotted field names as pydantic's nested `exclude`, by section: "sft.checkpoint.resume"
    -> {"sft": {"checkpoint": {"resume": True}}}."""
    tree: dict[str, Any] = {}
    for name in names:
        *path, last = name.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[last] = True
    return tree


def declared_settings(cfg: Config, stage: Stage) -> dict[str, Any]:
    """The settings `stage` declares it reads, as its fingerprint covers them."""
    skip = _exclusions(stage.unfingerprinted)
    settings: dict[str, Any] = {}
    for name in sorted(stage.reads):
        section, _, field_name = name.partition(".")
        value = getattr(cfg, section)
        if not field_name:
            settings[name] = value.model_dump(mode="json", exclude=skip.get(section) or None)
        elif name not in stage.unfingerprinted:
            settings[name] = _plain(getattr(value, field_name))
    return settings


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


class EarlierLayout(UserError):
    """A finished folder made by another version of a stage: never reused, never overwritten
    without being asked."""


def earlier_layout(stage: Stage, folder: Path, marker: dict, run: RunDir) -> EarlierLayout:
    made_by = marker.get("hanlm", "an earlier hanlm")
    version = marker.get("version")
    said = f"version {version} of the stage" if version is not None else "an earlier layout"
    return EarlierLayout(
        f"{folder} was made by {made_by} with {said}; this hanlm writes version "
        f"{stage.version}, so the {stage.name} stage cannot reuse it",
        where=str(folder / "stage.json"),
        fix=f"redo it and the stages after it with `hanlm run --run {run.root} --from "
        f"{stage.name}` (or `hanlm {stage.name} --run {run.root} --force`), or start a new run "
        "folder",
    )
