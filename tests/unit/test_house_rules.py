"""The house's size and shape, read from the source: no file over 700 lines, no function over
100, and no circle among hanlm's modules (counting the imports a function defers too: a circle
through a deferred import still means neither module can be read without the other)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hanlm"
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 100


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_is_a_hub(path: Path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{lines} lines: split it along its seams"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_over_a_hundred_lines(path: Path):
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"split: {', '.join(long)}"


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The hanlm modules `path` imports, at the top or in a function."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([base] if base else [])])
            for alias in node.names:  # `from hanlm.x import y`: y a module, else x itself
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
    return {name for name in found if name in known and name != own}


def test_no_import_circle():
    paths = {module_name(p): p for p in modules()}
    known = set(paths)
    graph = {name: imports_of(path, known) for name, path in paths.items()}
    # a depth-first walk: an edge back to a module still on the walk's stack closes a circle
    circles = []
    state: dict[str, int] = {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)
