"""The eval stage: the run's models (or cfg.eval.models) on cfg.eval.tasks into `RUN/eval/`,
every score split by the run's decontamination report (see hanlm.evals.run)."""

from __future__ import annotations

from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.demo import FILE_NAMES as DEMO_FILE_NAMES
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.evals.harness import require_model_folder
from hanlm.evals.run import evaluate, options_from
from hanlm.files import fingerprint, read_json, stage_fingerprint
from hanlm.model_folder import is_model_folder
from hanlm.stages.rundir import RunDir


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
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _data_identity(path: str | None) -> list | str | None:
    if path is None or path.startswith("hf:") or not Path(path).exists():
        return path
    p = Path(path)
    return [str(p), p.stat().st_size, p.stat().st_mtime_ns]


def run(cfg: Config, run: RunDir | Path, *, force: bool = False) -> dict:
    """The eval stage: the run's model (or cfg.eval.models) on cfg.eval.tasks -> RUN/eval/."""
    run = RunDir.of(run)
    out = run.eval
    models = [_in_run(run, m) for m in cfg.eval.models] or default_models(run)
    model_dirs = [require_model_folder(model_folder(m)) for m in models]
    report = cfg.eval.contamination or default_contamination(run)
    files = demo_files(run)
    sources = []
    for spec in cfg.eval.tasks:
        name, source = tasks_lib.parse_task_spec(spec)
        sources.append(source or tasks_lib.get(name).default_source(files))
    fp = fingerprint(
        cfg.eval.model_dump(mode="json"),
        cfg.generate.model_dump(mode="json"),  # the repetition task's penalties
        cfg.run.seed,
        [_model_identity(d) for d in model_dirs],
        [_data_identity(s) for s in sources],
        _data_identity(str(report) if report else None),
    )
    if not force and stage_fingerprint(out) == fp:
        info(f"eval: {out} is complete, skipped")
        return {**read_json(run.eval_results), "skipped": True}
    record = evaluate(
        model_dirs,
        cfg.eval.tasks,
        out,
        demo_files=files,
        contamination=report,
        options=options_from(cfg),
        batch_size=cfg.eval.batch_size,
        dtype=cfg.eval.dtype,
        device=cfg.eval.device,
        extra_record={"fingerprint": fp},
    )
    return {**record, "skipped": False}
