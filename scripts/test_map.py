"""Which tests cover which module: the table in tests/README.md, read from the source.

    python scripts/test_map.py           # print the table
    python scripts/test_map.py --write   # put it into tests/README.md
    python scripts/test_map.py --check   # exit 1 when tests/README.md's table is out of date

A test file covers a module directly when it imports it (`import hanlm.x`, `from hanlm.x import
y`, `from hanlm.a import b` where b is a module; a name that a package re-exports counts for the
module defining it; an import inside a function counts too), uses a name of a module it imported
(`checkpoint.save` after `from hanlm.train import checkpoint`), names it in a string
(`monkeypatch.setattr("hanlm.x.f", ...)`), or runs or imports a script of tests/workers/ that
does. Helpers in tests/support/ and conftest.py do not count.

A module no test covers directly is listed with the tests that reach it through the CLI (a
command named in `cli("X", ...)`, `run_subprocess("X", ...)` or `-m hanlm X`; `hanlm run` and
`run_pipeline` reach every stage) or a stage (`run_stage("X", ...)`), and otherwise marked
"through" the hanlm modules that import it.

The files are scanned with regular expressions (each import statement found is parsed with
`ast`): parsing the whole source takes seconds, scanning it a tenth of one, which keeps
tests/unit/test_test_map.py cheap. Nothing is imported, so the map is the same on any machine.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hanlm"
TESTS = ROOT / "tests"
TEST_FOLDERS = ("unit", "integration")
WORKERS = TESTS / "workers"
README = TESTS / "README.md"
BEGIN = "<!-- test-map: made by scripts/test_map.py -->"
END = "<!-- /test-map -->"
MOST_CALLERS = 4  # a "through" cell names at most this many importers

# an import statement at the start of a line (in a function too), parentheses and all
IMPORT = re.compile(
    r"^[ \t]*(from[ \t]+[.\w]+[ \t]+import[ \t]+(?:\([^)]*\)|[^\n]*)|import[ \t]+[^\n]*)", re.M
)
DOTTED = re.compile(r"""["'](hanlm(?:\.\w+)+)["']""")  # "hanlm.x.y" in quotes
SCRIPT = re.compile(r"""["'](\w+)\.py["']""")  # "two_rank_checks.py"
RUNS = re.compile(r"""\b(?:cli|run_subprocess|run_stage)\(\s*["']([\w-]+)["']""")
MODULE_RUN = re.compile(r"""["']-m["'],\s*["']hanlm["'],\s*["']([\w-]+)["']""")
PIPELINE = re.compile(r"\brun_pipeline\(")
PROCESS = re.compile(r"""\brun_subprocess\(|["']-m["'],\s*["']hanlm["']""")  # python -m hanlm
TOP_DEF = re.compile(r"^def (\w+)", re.M)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _own_code(text: str) -> bool:
    """Whether a package's __init__ holds more than a docstring, imports and `__all__`."""
    for i, node in enumerate(ast.parse(text).body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "__all__"
        ]:
            continue
        return True
    return False


def import_statements(text: str) -> list[ast.Import | ast.ImportFrom]:
    found = []
    for match in IMPORT.finditer(text):
        try:
            found += ast.parse(match.group(1).strip()).body
        except SyntaxError:
            continue  # "import" at the start of a line of prose
    return [n for n in found if isinstance(n, ast.Import | ast.ImportFrom)]


class Package:
    """hanlm's modules: which the table lists, what each package re-exports, who imports whom."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.packages: set[str] = set()
        for path in sorted(PACKAGE.rglob("*.py")):
            name = module_name(path)
            self.texts[name] = path.read_text(encoding="utf-8")
            if path.name == "__init__.py":
                self.packages.add(name)
        # every module but a package's __init__ that only re-exports
        self.mapped = sorted(
            n for n in self.texts if n not in self.packages or _own_code(self.texts[n])
        )
        self.reexports = {p: self._reexports(p) for p in self.packages}

    def _absolute(self, node: ast.ImportFrom, where: str) -> str:
        if not node.level:
            return node.module or ""
        base = where.split(".")
        base = base if where in self.packages else base[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def _reexports(self, package: str) -> dict[str, str]:
        found = {}
        for node in import_statements(self.texts[package]):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(node, package)
                for alias in node.names:
                    found[alias.asname or alias.name] = f"{source}.{alias.name}"
        return found

    def resolve(self, dotted: str, depth: int = 0) -> str | None:
        """The listed module that `dotted` (a module, or a name in one) comes from, or None."""
        if dotted in self.texts:
            if dotted in self.packages and dotted not in self.mapped:
                return None  # the package as such: the names taken from it say which module
            return dotted
        head, _, name = dotted.rpartition(".")
        if head in self.packages and name in self.reexports[head] and depth < 5:
            found = self.resolve(self.reexports[head][name], depth + 1)
            if found:
                return found
        if head == "hanlm" or head not in self.texts:
            return None  # "hanlm.toml" is a file's name, not a name in hanlm/__init__.py
        return self.resolve(head, depth + 1)

    def imports(self, text: str, where: str = "", bound: dict[str, str] | None = None) -> set[str]:
        """The listed modules `text` imports, uses a name of, or names in a string; `bound`:
        local names of hanlm modules that the text uses without importing them itself."""
        found: set[str] = set()
        bound = dict(bound or {})  # a local name -> the hanlm module (or package) it is
        for node in import_statements(text):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("hanlm"):
                        found.add(alias.name)
                        if alias.asname:
                            bound[alias.asname] = alias.name
            else:
                source = self._absolute(node, where)
                if source.split(".")[0] != "hanlm":
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    found.add(target)
                    if target in self.texts:
                        bound[alias.asname or alias.name] = target
        if bound:
            names = "|".join(sorted(map(re.escape, bound)))
            for match in re.finditer(rf"(?<![\w.])({names})\.(\w+)", text):
                found.add(f"{bound[match.group(1)]}.{match.group(2)}")
        found.update(DOTTED.findall(text))
        return {m for m in map(self.resolve, found) if m}

    def bindings(self, text: str, where: str) -> dict[str, str]:
        """A module's names for the hanlm modules it imports `from` a package."""
        bound = {}
        for node in import_statements(text):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(node, where)
                for alias in node.names:
                    if f"{source}.{alias.name}" in self.texts:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        return bound

    def callers(self) -> dict[str, set[str]]:
        """Module -> the listed modules that import it (in a function too) or name it."""
        found: dict[str, set[str]] = {m: set() for m in self.mapped}
        for name in self.mapped:
            for target in self.imports(self.texts[name], name) - {name}:
                found[target].add(name)
        for package in self.packages & set(self.mapped):  # a registry: ("kobest", "demo_qa")
            named = set(re.findall(r"""["'](\w+)["']""", self.texts[package]))
            for module in self.mapped:
                head, _, last = module.rpartition(".")
                if head == package and last in named:
                    found[module].add(package)
        return found

    def stages(self) -> dict[str, str]:
        """Stage name -> its module, from hanlm.pipeline (`"corpus": "hanlm.stages.corpus"`,
        and DEMO, the demo stage's)."""
        text = self.texts.get("hanlm.pipeline", "")
        found = dict(re.findall(r"""["'](\w+)["']:\s*["'](hanlm\.stages\.\w+)["']""", text))
        demo = re.search(r"""^DEMO\s*=\s*["'](hanlm\.stages\.\w+)["']""", text, re.M)
        if demo:
            found["demo"] = demo.group(1)
        return found

    def commands(self) -> dict[str, set[str]]:
        """CLI command -> the modules its `cmd_NAME` function in hanlm.cli uses."""
        found: dict[str, set[str]] = {}
        for name in self.texts:
            if not name.startswith("hanlm.cli"):
                continue
            text = self.texts[name]
            starts = [m.start() for m in TOP_DEF.finditer(text)]
            if not starts:
                continue
            bound = self.bindings(text[: starts[0]], name)
            for start, stop in zip(starts, [*starts[1:], len(text)], strict=True):
                function = TOP_DEF.match(text, start).group(1)
                if function.startswith("cmd_"):
                    command = function.removeprefix("cmd_").replace("_", "-")
                    body = text[start:stop]
                    found.setdefault(command, set()).update(self.imports(body, name, bound))
        return found


def commands_run(text: str) -> set[str]:
    """The CLI commands and stages a test runs: `cli("X")`, `run_subprocess("X")`,
    `run_stage("X")`, a command line with `-m hanlm X`; `run_pipeline(...)` is `run`."""
    found = set(RUNS.findall(text)) | set(MODULE_RUN.findall(text))
    if PIPELINE.search(text):
        found.add("run")
    return found


def workers_run(text: str, workers: dict[str, str]) -> set[str]:
    """The scripts of tests/workers/ a file runs or imports, and theirs in turn."""
    names = set(SCRIPT.findall(text))
    for node in import_statements(text):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    found = names & workers.keys()
    for name in sorted(found):
        found |= workers_run(workers[name], {k: v for k, v in workers.items() if k != name})
    return found


def coverage() -> tuple[Package, dict[str, set[str]], dict[str, set[str]]]:
    """(the package, module -> the tests that cover it directly, module -> the tests that reach
    it through the CLI or a stage)."""
    package = Package()
    workers = {p.stem: p.read_text(encoding="utf-8") for p in sorted(WORKERS.glob("*.py"))}
    stages, commands = package.stages(), package.commands()
    cli = [m for m in package.mapped if m.split(".")[:2] == ["hanlm", "cli"]]
    direct: dict[str, set[str]] = {m: set() for m in package.mapped}
    reached: dict[str, set[str]] = {m: set() for m in package.mapped}
    for folder in TEST_FOLDERS:
        for path in sorted((TESTS / folder).glob("test_*.py")):
            test, text = f"{folder}/{path.name}", path.read_text(encoding="utf-8")
            modules = package.imports(text)
            for worker in workers_run(text, workers):
                modules |= package.imports(workers[worker])
            for module in modules:
                direct[module].add(test)
            ran = commands_run(text)
            if "run" in ran:
                ran |= set(stages)
            for command in ran & (set(stages) | set(commands)):
                for module in {stages.get(command), *commands.get(command, ()), *cli} - {None}:
                    reached[module].add(test)
            if PROCESS.search(text):
                reached.get("hanlm.__main__", set()).add(test)
    return package, direct, reached


def table() -> str:
    package, direct, reached = coverage()
    callers = package.callers()
    lines = ["| Module | Tests |", "| --- | --- |"]
    for module in package.mapped:
        if module == "hanlm":
            cell = "every test: Python runs it before any module of the package"
        elif direct[module]:
            cell = ", ".join(sorted(direct[module]))
        elif reached[module]:
            cell = "through the CLI or a stage: " + ", ".join(sorted(reached[module]))
        elif callers[module]:
            # the importers that tests cover directly first, then the rest
            ranked = sorted(callers[module], key=lambda c: (not direct[c], c))
            names = [f"`{c}`" for c in ranked[:MOST_CALLERS]]
            if len(ranked) > MOST_CALLERS:
                names.append(f"{len(ranked) - MOST_CALLERS} more")
            cell = "through " + ", ".join(names)
        else:
            cell = "**none**"
        lines.append(f"| `{module}` | {cell} |")
    return "\n".join(lines) + "\n"


def section() -> str:
    """The table between its markers, as tests/README.md holds it."""
    return f"{BEGIN}\n\n{table()}\n{END}"


def readme_section(text: str) -> str | None:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        return None
    return text[start : stop + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="put the table into tests/README.md")
    group.add_argument("--check", action="store_true", help="exit 1 if tests/README.md differs")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(table(), end="")
        return 0
    text = README.read_text(encoding="utf-8")
    old = readme_section(text)
    if old is None:
        print(f"{README} has no {BEGIN} ... {END} section to fill", file=sys.stderr)
        return 1
    new = section()
    if args.check:
        if old != new:
            print("tests/README.md's map is out of date: run python scripts/test_map.py --write")
            return 1
        return 0
    if old != new:
        README.write_text(text.replace(old, new), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
