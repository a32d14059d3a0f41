"""The eval stage: the run's models (or cfg.eval.models) on cfg.eval.tasks into `RUN/eval/`,
every score split by the run's decontamination report (see hanlm.evals.run)."""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.data import dataset_repo
from hanlm.demo import FILE_NAMES as DEMO_FILE_NAMES
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.evals.harness import require_model_folder
from hanlm.evals.results import EvalResults
from hanlm.evals.run import options_from, run_evaluation, write_results
from hanlm.model_folder import is_model_folder
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import NoOptions, Stage, StageContext


def demo_files(run: RunDir | Path) -> dict[str, Path]:
    """The run's demo world files by kind: the default data of the demo tasks."""
    run = RunDir.of(run)
    return {kind: run.demo_file(kind) for kind in DEMO_FILE_NAMES}


def default_contamination(run: RunDir | Path) -> Path | None:
    """The run's decontamination items.jsonl when the decontam stage wrote one."""
    path = RunDir.of(run).decontam_items
    return path if path.is_file() else None


def _in_run(run: RunDir, model: str) -> Path:
    """A relative model path names a folder of the run (e.g. `pretrain/hf`) when one is there."""
    path = Path(model)
    if not path.is_absolute() and (run.root / path).exists():
        return run.root / path
    return path


def model_folder(path: str | Path) -> Path:
    """A model folder as given, or a hanlm run directory's SFT (else pretraining) export."""
    path = Path(path)
    if is_model_folder(path):
        return path
    run = RunDir(path)
    for candidate in (run.sft.export, run.pretrain.export):
        if is_model_folder(candidate):
            return candidate
    return path  # not a model: the library's check says so


def default_models(run: RunDir | Path) -> list[Path]:
    """Every export the run has, side by side: the base model, then the chat model."""
    run = RunDir.of(run)
    found = [
        candidate
        for candidate in (run.pretrain.export, run.sft.export)
        if is_model_folder(candidate)
    ]
    if found:
        return found
    looked = " and ".join(
        str(export.relative_to(run.root)) for export in (run.sft.export, run.pretrain.export)
    )
    raise UserError(
        f"no exported model in {run.root} (looked for {looked})",
        fix=f"run `hanlm export --run {run.root}` first, or give --model DIR",
    )


def _model_identity(model_dir: Path) -> list:
    # weights are large: their names, sizes and times stand for their content
    files = sorted(path for path in model_dir.iterdir() if path.is_file())
    return [(path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in files]


def _data_identity(path: str | None) -> list | str | None:
    """A data file by path, size and time; an `hf:` id by the commit it is read at (a
    snapshot's download commit; the Hub's, resolved online), so an update upstream is new."""
    if path is not None and dataset_repo.is_hf_id(path):
        return [path, dataset_repo.input_revisions([path]).get(path)]
    if path is None or not Path(path).exists():
        return path
    data_file = Path(path)
    return [str(data_file), data_file.stat().st_size, data_file.stat().st_mtime_ns]


def _uses_demo(cfg: Config, options: NoOptions) -> bool:
    """Whether a task named without data reads the demo world (its default in a run)."""
    stand_ins = {kind: Path(name) for kind, name in DEMO_FILE_NAMES.items()}
    for spec in tasks_lib.expand_specs(cfg.eval.tasks)[0]:
        name, source = tasks_lib.parse_task_spec(spec)
        default = None if source else tasks_lib.get(name).default_source(stand_ins)
        if default is not None and not str(default).startswith("hf:"):
            return True
    return False


def _models(cfg: Config, run: RunDir) -> list[Path]:
    models = [_in_run(run, model) for model in cfg.eval.models] or default_models(run)
    return [require_model_folder(model_folder(model)) for model in models]


def _sources(cfg: Config, run: RunDir) -> list[str | None]:
    files = demo_files(run)
    sources = []
    for spec in tasks_lib.expand_specs(cfg.eval.tasks)[0]:
        name, source = tasks_lib.parse_task_spec(spec)
        sources.append(source or tasks_lib.get(name).default_source(files))
    return sources


def inputs(cfg: Config, run: RunDir, options: NoOptions) -> list:
    """The models, the tasks' data and the contamination report, by identity."""
    report = cfg.eval.contamination or default_contamination(run)
    return [
        [_model_identity(model_dir) for model_dir in _models(cfg, run)],
        [_data_identity(source) for source in _sources(cfg, run)],
        _data_identity(str(report) if report else None),
    ]


def build(ctx: StageContext) -> EvalResults:
    """The run's models (or eval.models) on eval.tasks."""
    cfg, run = ctx.cfg, ctx.run
    evaluation = run_evaluation(
        _models(cfg, run),
        cfg.eval.tasks,
        demo_files=demo_files(run),
        contamination=cfg.eval.contamination or default_contamination(run),
        options=options_from(cfg),
        batch_size=cfg.eval.batch_size,
        dtype=cfg.eval.dtype,
        device=cfg.eval.device,
    )
    write_results(ctx.out, evaluation)
    info(f"eval: results in {run.eval}")
    return evaluation.record


STAGE = Stage(
    name="eval",
    version=1,
    output=lambda run: run.eval,
    result=EvalResults,
    reads=("eval", "generate", "run.seed"),  # generate: the repetition task's penalties
    after=("decontam",),  # its items' statuses split every score
    uses_demo=_uses_demo,
    build=build,
    inputs=inputs,
)
