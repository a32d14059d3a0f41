"""tests/README.md's table of which tests cover which module is the one scripts/test_map.py
makes from the source now: a new module, or a test that starts importing one, changes it."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_map.py"
FIX = "run python scripts/test_map.py --write"


def _test_map():
    spec = importlib.util.spec_from_file_location("hanlm_test_map", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_map_of_modules_to_tests_is_up_to_date():
    test_map = _test_map()
    held = test_map.readme_section(test_map.README.read_text(encoding="utf-8"))
    if held is None:
        pytest.fail(f"tests/README.md has no {test_map.BEGIN} ... {test_map.END} section: {FIX}")
    made = test_map.section()
    diff = difflib.unified_diff(held.splitlines(), made.splitlines(), lineterm="", n=0)
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert held == made, (
        f"tests/README.md's map of modules to tests is out of date: {FIX}\n"
        + "\n".join(changed[:20])
    )


def test_imports_in_functions_aliases_strings_and_re_exports_count():
    test_map = _test_map()
    package = test_map.Package()
    # the dotted names are put together here: this file is scanned as a test too, and a name in
    # quotes would count as this file's own reference
    minhash, config = ".".join(["hanlm", "data", "minhash"]), ".".join(["hanlm", "config"])
    text = (
        "import hanlm.korean as k\n"
        "from hanlm.errors import UserError\n\n\n"
        "def test_x(monkeypatch):\n"
        "    from hanlm import files\n"
        "    files.anything()\n"
        f'    monkeypatch.setattr("{minhash}.a_name", None)\n'
    )
    expected = {"korean", "errors", "files", "data.minhash"}
    assert package.imports(text) == {f"hanlm.{name}" for name in expected}
    # a name a package re-exports counts for the module that defines it; the package that
    # only re-exports has no row of its own
    defining = package.resolve(f"{config}.Config")
    assert defining and "class Config(" in package.texts[defining]
    assert config not in package.mapped
