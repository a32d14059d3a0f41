"""docs/design.md names only what exists: every code name it quotes that starts at one of hanlm's
modules (`pipeline._run`, `train.sft.train_once`, `hanlm.results.Result`) resolves to a module
and its attributes, and every file it quotes (`train/build.py`, `tests/unit/test_layers.py`)
is there. A quoted setting such as `preflight.timeout_s` resolves as a field of the config."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import hanlm
from hanlm.config import Config

ROOT = Path(hanlm.__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# the worked example of a new stage ("Adding a stage"): files it would add
EXAMPLE = {"data/lengths.py", "stages/lengths.py", "stages/NAME.py"}
FILES = (".py", ".toml", ".md", ".json", ".jsonl", ".png", ".log")  # run files quoted by name
MODULES = {p.stem for p in Path(hanlm.__file__).parent.iterdir()
           if not p.stem.startswith("_") and (p.suffix == ".py" or p.is_dir())}  # fmt: skip


def quoted() -> list[str]:
    names = re.findall(r"`([^`\s]+)`", DESIGN.read_text(encoding="utf-8"))
    return sorted({re.sub(r"\(.*\)$", "", name) for name in names})


def resolves(dotted: str) -> bool:
    parts = dotted.removeprefix("hanlm.").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module("hanlm." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except AttributeError:
            return False
        return True
    return False


def is_setting(dotted: str) -> bool:
    target = Config()
    for part in dotted.split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return True


def test_every_code_name_design_md_quotes_exists():
    missing = []
    package = Path(hanlm.__file__).parent
    for name in quoted():
        if name in EXAMPLE:
            continue
        if name.endswith(".py"):  # from the checkout, or from any folder of the package
            if not ((ROOT / name).is_file() or any(package.rglob(name))):
                missing.append(name)
        elif name.endswith(FILES):
            continue
        elif (
            "." in name
            and name.removeprefix("hanlm.").split(".")[0] in MODULES
            and not (resolves(name) or is_setting(name))
        ):
            missing.append(name)
    assert not missing, f"docs/design.md quotes names that do not exist: {missing}"


@pytest.mark.parametrize("name", ["pipeline._cmd_run", "train/trainer_v2.py"])
def test_a_renamed_name_would_be_found(name):
    if name.endswith(".py"):
        assert not (ROOT / "hanlm" / name).is_file()
    else:
        assert not resolves(name)
