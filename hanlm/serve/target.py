"""What `hanlm serve` was asked to serve: a run (its chat model, else its base model, and the
run's own [generate] settings), an exported model folder (or a Hub id), or a GGUF file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hanlm.errors import UserError
from hanlm.model_folder import CONFIG, check_model_folder, is_hub_id, is_model_folder
from hanlm.stages.rundir import CONFIG_FILE, RunDir

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Target:
    name: str  # the model id clients name (`/v1/models`)
    folder: Path | None  # the Hugging Face folder; None for a GGUF file given as it is
    gguf: Path | None  # the GGUF file given; None for a folder
    run: RunDir | None  # the run the folder belongs to
    label: str  # "chat" or "base" for a run's model (its GGUF file's name)


def run_of(target: Path | str) -> Path | None:
    """The run folder `target` is, or whose exported model folder it is; None otherwise."""
    if is_hub_id(target):
        return None
    path = Path(target)
    for candidate in (path, path.parent.parent):
        if candidate.is_dir() and (candidate / CONFIG_FILE).is_file():
            return candidate if candidate == path or path.parent.name in RUN_MODELS else None
    return None


RUN_MODELS = {"sft": "chat", "pretrain": "base"}  # a run's exported folders, by their stage


def resolve(target: Path | str) -> Target:
    """The model behind `target`, checked (a UserError saying what is wrong otherwise)."""
    if is_hub_id(target):
        folder = check_model_folder(target)
        return Target(str(target), folder, None, None, "model")
    path = Path(target)
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise UserError(
                    f"{path} is not a GGUF file",
                    fix="give a .gguf file, a model folder (config.json, safetensors, tokenizer) "
                    "or a run folder",
                )
        return Target(path.stem, None, path, None, "model")
    if is_model_folder(path):
        folder = check_model_folder(path)
        root = run_of(path)
        run = RunDir(root) if root is not None else None
        if run is None or folder.resolve() not in {run.sft.export.resolve(),
                                                   run.pretrain.export.resolve()}:  # fmt: skip
            return Target(folder.resolve().name, folder, None, None, "model")
        label = RUN_MODELS[folder.parent.name]
        return Target(f"{root.resolve().name}-{label}", folder, None, run, label)
    if path.is_dir() and (path / CONFIG_FILE).is_file():
        run = RunDir(path)
        for folder, label in ((run.sft.export, "chat"), (run.pretrain.export, "base")):
            if is_model_folder(folder):
                return Target(f"{path.resolve().name}-{label}", check_model_folder(folder), None,
                              run, label)  # fmt: skip
        raise UserError(
            f"the run {path} has no exported model (neither sft/hf nor pretrain/hf)",
            fix=f"finish the run (hanlm run --run-dir {path}) or export it "
            f"(hanlm export --run-dir {path})",
        )
    if not path.exists():
        raise UserError(
            f"no model at {path}",
            fix="give a run folder, an exported model folder, a .gguf file or a Hub id (org/name)",
        )
    raise UserError(
        f"{path} is neither a run folder (no {CONFIG_FILE}) nor a model folder (no {CONFIG})",
        fix="give a run folder, an exported model folder (e.g. RUN/sft/hf) or a .gguf file",
    )
