"""The run directory's layout: every path of `runs/NAME/` is composed here and nowhere else.

The folders are named here; a file inside a stage's folder is named by the library that writes
it (its output format, e.g. decontam's items.jsonl), and composed into a path here. Stages get
their inputs and outputs from a `RunDir`; the libraries below them take explicit paths and
never learn where a run keeps anything. `load_run_config` and `save_run_config` hand
hanlm.config the run's own config.toml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hanlm.config import (
    Config,
    config_to_toml,
    folder_given_as_config,
    load_config,
    recipe_names,
    save_config,
)
from hanlm.data import corpus as corpus_lib
from hanlm.data import tokenizer as tokenizer_lib
from hanlm.data.decontam import outputs as decontam_outputs
from hanlm.data.manifest import MANIFEST_NAME
from hanlm.demo import FILE_NAMES as DEMO_FILE_NAMES
from hanlm.errors import UserError
from hanlm.files import check_folder_path
from hanlm.plan.measured import RehearsalRecord
from hanlm.stages.markers import stage_fingerprint

CONFIG_FILE = "config.toml"  # the resolved configuration a run saves and reuses
CHECKPOINTS = "checkpoints"
EXPORT = "hf"  # the Hugging Face folder a training stage exports into


def finished_output(path: Path, what: str, fix: str) -> Path:
    """`path`, a file of a stage whose folder is marked complete; else a UserError saying there
    is no finished `what` in that folder, and `fix`."""
    if stage_fingerprint(path.parent) is None or not path.is_file():
        raise UserError(f"no finished {what} in {path.parent}", fix=fix)
    return path


@dataclass(frozen=True)
class TrainingDirs:
    """What one training stage (pretrain or sft) keeps under its folder. `place` names the
    training in a store that several runs share (`RUN/pretrain`, `RUN/compare/drop/pretrain`,
    `RUN/sft/ablation/VARIANT`): its checkpoints' folder under `[checkpoint] mirror`."""

    root: Path
    place: str

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def export(self) -> Path:
        return self.root / EXPORT


@dataclass(frozen=True)
class SftDirs(TrainingDirs):
    """SFT's folder: a training folder plus its audit, data report and closure checks, and one
    training folder per compared initialisation."""

    @property
    def audit(self) -> Path:
        return self.root / "audit.json"

    @property
    def data_report(self) -> Path:
        return self.root / "data.json"

    @property
    def closure(self) -> Path:
        return self.root / "closure.json"

    def ablation(self, variant: str) -> SftDirs:
        return SftDirs(self.root / "ablation" / variant, f"{self.place}/ablation/{variant}")


COMPARE = "compare"  # RUN/compare/ACTION: the same recipe on the corpus after decontam ACTION
REHEARSAL = "rehearsal"  # RUN/rehearsal: `hanlm rehearse`; its own runs: resume, tune/NAME
TUNE = "tune"


def place_of(root: Path) -> str:
    """A run folder's name in a store several runs share (the checkpoint mirror): its folder's
    name, and a run inside a run (the comparison, the rehearsal and its runs) below its
    parent's. Read from the path alone, so that every command naming the folder gets the same
    place: `hanlm run`'s comparison and `hanlm pretrain --run-dir RUN/compare/drop` alike."""
    root = Path(root).absolute()
    parent = root.parent
    if parent.name == COMPARE:
        return f"{place_of(parent.parent)}/{COMPARE}/{root.name}"
    if root.name == REHEARSAL or parent.name == REHEARSAL:
        return f"{place_of(parent)}/{root.name}"
    if parent.name == TUNE and parent.parent.name == REHEARSAL:
        return f"{place_of(parent.parent)}/{TUNE}/{root.name}"
    return root.name


@dataclass(frozen=True)
class RunDir:
    """`runs/NAME/`: one folder per stage plus the run's config, plan, preflight and report.
    `place`: its name under a shared store (place_of)."""

    root: Path
    place: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        object.__setattr__(self, "place", place_of(self.root))

    @classmethod
    def of(cls, run: RunDir | Path | str) -> RunDir:
        """A RunDir for a stage's `run` argument, which may also be a plain path."""
        return run if isinstance(run, RunDir) else cls(Path(run))

    def stage(self, name: str) -> Path:
        """The folder a stage writes (and marks complete) under the run."""
        return self.root / name

    # --- the run as a whole ---------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def plan(self) -> Path:
        return self.stage("plan") / "plan.json"

    @property
    def preflight(self) -> Path:
        return self.stage("preflight") / "preflight.json"

    @property
    def launch(self) -> Path:
        """`hanlm launch`'s folder: the engine's task or script, the recipe, launch.json."""
        return self.root / "launch"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    # --- data -----------------------------------------------------------------------------
    @property
    def demo(self) -> Path:
        return self.stage("demo")

    def demo_file(self, kind: str) -> Path:
        """One of the demo world's files: pretrain, benchmark, chat, facts or planted."""
        return self.demo / DEMO_FILE_NAMES[kind]

    @property
    def corpus(self) -> Path:
        return self.stage("corpus")

    @property
    def corpus_stats(self) -> Path:
        return self.corpus / corpus_lib.STATS_FILE

    @property
    def decontam(self) -> Path:
        return self.stage("decontam")

    @property
    def decontam_report(self) -> Path:
        return self.decontam / decontam_outputs.REPORT_FILE

    @property
    def decontam_items(self) -> Path:
        return self.decontam / decontam_outputs.ITEMS_FILE

    @property
    def decontam_index(self) -> Path:
        return self.decontam / decontam_outputs.INDEX_FILE

    @property
    def decontam_partial(self) -> Path:
        """Where `--shard I/N` scans leave their partial results until `decontam merge`."""
        return self.stage("decontam-partial")

    @property
    def decontam_corpus(self) -> Path:
        """The corpus with the leaked passages removed (when decontam's action changes text)."""
        return self.decontam / decontam_outputs.CORPUS_DIR

    @property
    def tokenizer(self) -> Path:
        return self.stage("tokenizer")

    @property
    def tokenizer_json(self) -> Path:
        return self.tokenizer / tokenizer_lib.TOKENIZER_FILE

    @property
    def shards(self) -> Path:
        return self.stage("shards")

    @property
    def shards_manifest(self) -> Path:
        return self.shards / MANIFEST_NAME

    @property
    def corpus_work(self) -> Path:
        """The corpus stage's data-engine work folder, kept until its jobs are done."""
        return self.stage("corpus.work")

    @property
    def shards_work(self) -> Path:
        """The shards stage's data-engine work folder, kept until every part is encoded."""
        return self.stage("shards.work")

    # --- training -------------------------------------------------------------------------
    @property
    def pretrain(self) -> TrainingDirs:
        return TrainingDirs(self.stage("pretrain"), f"{self.place}/pretrain")

    @property
    def sft(self) -> SftDirs:
        return SftDirs(self.stage("sft"), f"{self.place}/sft")

    @property
    def gguf(self) -> Path:
        """GGUF files for llama.cpp and Ollama, each with its Modelfile (`export --format gguf`)."""
        return self.stage("gguf")

    # --- evaluation -----------------------------------------------------------------------
    @property
    def eval(self) -> Path:
        return self.stage("eval")

    @property
    def eval_results(self) -> Path:
        return self.eval / "results.json"

    @property
    def eval_samples(self) -> Path:
        return self.eval / "samples.jsonl"

    # --- the decontamination comparison ---------------------------------------------------
    def comparison(self, action: str) -> RunDir:
        """A run of the same recipe on the corpus after decontam `action` (the compare stage)."""
        return RunDir(self.root / COMPARE / action)

    # --- the rehearsal ----------------------------------------------------------------------
    @property
    def rehearsal(self) -> RunDir:
        """The rehearsal's own run folder (`hanlm rehearse`): every stage at small budgets,
        never read as the run's."""
        return RunDir(self.root / REHEARSAL)

    @property
    def rehearsal_record(self) -> Path:
        return self.rehearsal.root / RehearsalRecord.FILE

    # --- sharing --------------------------------------------------------------------------
    @property
    def publish(self) -> Path:
        """The folder `hanlm publish` uploads to the Hub (written by --dry-run too)."""
        return self.stage("publish")


def load_run_config(
    run: RunDir | Path | str | None,
    source: str | Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
    *,
    recipe_fallback: bool = True,
) -> Config:
    """`config.load_config` for a command on the run `run` (or on none): the run's own
    config.toml is the default source when it exists; the run folder is checked once here."""
    if source is not None and str(source) not in recipe_names() and Path(str(source)).is_dir():
        inside = RunDir(Path(str(source))).config  # --config RUN: point at the run's own file
        if inside.is_file():
            raise folder_given_as_config(Path(str(source)), inside)
    if run is None:
        return load_config(source, overrides, None, values, recipe_fallback=recipe_fallback)
    run = RunDir.of(run)
    check_folder_path(run.root, "the run directory (--run)")
    return load_config(source, overrides, run.config, values, recipe_fallback=recipe_fallback)


def save_run_config(cfg: Config, run: RunDir | Path | str) -> Path:
    """Save the configuration a stage ran with as the run's config.toml (its next default);
    a file that already says the same is left as it is (a rerun with every stage up to date
    writes nothing)."""
    path = RunDir.of(run).config
    if path.is_file() and path.read_text(encoding="utf-8") == config_to_toml(cfg):
        return path
    return save_config(cfg, path)
