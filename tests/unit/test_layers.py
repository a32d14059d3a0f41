"""The import rule of docs/design.md, read from the source: every module imports only its own
layer or lower ones, and a function imports locally only to defer a heavy library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hanlm"

# Lowest first: a component imports only components before it (and itself). The order is the
# layering of docs/design.md: shared basics, then the model and the libraries, then the stages
# that wire them to a run directory, then the pipeline and the command line.
ORDER: tuple[str, ...] = (
    "errors",
    "exit_status",
    "import_noise",
    "ranks",
    "__init__",
    "console",
    "files",
    "streams",
    "disk_errors",
    "results",
    "run_lock",
    "remote_code",
    "korean",
    "prompts",
    "chat_template",
    "config",
    "model_folder",
    "testsets",
    "model_presets",
    "model",
    "model_init",
    "demo",
    "inference",
    "chat",
    "data",
    "plan",
    "train",
    "preflight",
    "launch",
    "evals",
    "report",
    "share",
    "stages",
    "serve",
    "run_inputs",
    "pipeline",
    "rehearse",
    "cli",
    "__main__",
)
LAYER_OF = {name: i for i, name in enumerate(ORDER)}

# A function may import these locally: each costs seconds or GPU set-up to import, and the
# CLI's --help, the corpus workers and the data stages must not pay for them (pydantic and rich:
# `hanlm --help` answers before either is loaded).
HEAVY = frozenset(
    {
        "torch",
        "torchao",
        "transformers",
        "tokenizers",
        "datasets",
        "safetensors",
        "accelerate",
        "peft",
        "matplotlib",
        "pandas",
        "pyarrow",
        "lm_eval",
        "tensorboard",
        "numpy",
        "pydantic",
        "rich",
        "scipy",
        "datasketch",  # pulls in scipy
        "pynvml",  # GPU hosts only
        "fsspec",  # optional: checkpoint mirrors on remote storage
        "langdetect",
        "huggingface_hub",
        "datatrove",
        "ray",  # optional (hanlm[ray]): the data engine's Ray executor
        "liger_kernel",  # optional, CUDA only: the fused linear cross-entropy
        "gguf",  # optional (hanlm[gguf]): GGUF export
        "trackio",  # optional trackers
        "wandb",
        "yaml",  # PyYAML: the SkyPilot task, written only by `hanlm launch`
        "llama_cpp",  # optional (hanlm[serve]): llama.cpp, for `hanlm serve` alone
        "uvicorn",  # its server, with FastAPI
    }
)


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def component(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def imported_hanlm_components(node: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, component) of every hanlm module this node imports."""
    found = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "hanlm" and "." in alias.name:
                found.append((node.lineno, alias.name.split(".")[1]))
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against the importing module's package
            base = list(path.relative_to(PACKAGE).parent.parts)[: len(path.parts)]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            target = base + (node.module.split(".") if node.module else [])
            names = [target[0]] if target else [a.name for a in node.names]
            found.extend((node.lineno, n) for n in names)
        elif node.module and node.module.split(".")[0] == "hanlm":
            rest = node.module.split(".")[1:]
            if rest:
                found.append((node.lineno, rest[0]))
            else:  # from hanlm import x, y
                found.extend((node.lineno, a.name) for a in node.names)
    return found


def test_every_component_has_a_layer():
    unknown = {component(p) for p in modules()} - set(LAYER_OF)
    assert not unknown, f"place {sorted(unknown)} in ORDER (and docs/design.md)"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down(path: Path):
    own = component(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    wrong = []
    for node in ast.walk(tree):
        for line, target in imported_hanlm_components(node, path):
            if target == own or target == "__version__":
                continue
            if target not in LAYER_OF:
                wrong.append(f"line {line}: unknown component {target}")
            elif LAYER_OF[target] >= LAYER_OF[own]:
                wrong.append(f"line {line}: {own} imports {target}, which comes after it")
    assert not wrong, "\n".join(wrong)


def test_libraries_never_import_the_pipeline():
    """The rule as the issue states it, spelled out apart from the layer table."""
    top = {"stages", "cli", "pipeline"}
    libraries = {"data", "train", "evals", "chat", "plan", "preflight", "launch", "report"}
    for path in modules():
        if component(path) not in libraries:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for line, target in imported_hanlm_components(node, path):
                assert target not in top, f"{path}:{line} imports hanlm.{target}"
                if component(path) == "data":
                    assert target not in {"train", "evals"}, f"{path}:{line} imports {target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(tree: ast.Module) -> set[str]:
    """Modules imported when the module is: its statements outside functions and classes' methods."""
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
    return names


def heavy_modules() -> set[str]:
    """hanlm modules whose import pulls in a heavy library, directly or through other modules."""
    imports = {module_name(p): top_level_imports(ast.parse(p.read_text())) for p in modules()}
    heavy = {m for m, names in imports.items() if {n.split(".")[0] for n in names} & HEAVY}
    changed = True
    while changed:
        changed = False
        for m, names in imports.items():
            if m not in heavy and names & heavy:
                heavy.add(m)
                changed = True
    return heavy


HEAVY_MODULES = heavy_modules()


def local_imports(tree: ast.AST):
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield func.name, node


def defers_something_heavy(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    return any(n.split(".")[0] in HEAVY or n in HEAVY_MODULES for n in names)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_local_imports_only_defer_heavy_libraries(path: Path):
    tree = ast.parse(path.read_text())
    wrong = [
        f"line {node.lineno} in {func}(): {ast.unparse(node)}"
        for func, node in local_imports(tree)
        if getattr(node, "level", 0) or not defers_something_heavy(node)
    ]
    assert not wrong, "import at the top, or defer only a heavy library:\n" + "\n".join(wrong)


# cli/commands.py states the reason for its deferred imports once, above them all
REASON_STATED_FOR_THE_FILE = frozenset({"cli/commands.py"})


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_deferred_import_says_why(path: Path):
    """A comment on the import or just above it (or the function's docstring saying it imports
    lazily) gives the reason, so the next reader does not move it to the top."""
    if str(path.relative_to(PACKAGE)) in REASON_STATED_FOR_THE_FILE:
        return
    lines = path.read_text().splitlines()
    silent = []
    for func, node in local_imports(ast.parse(path.read_text())):
        context = " ".join(lines[max(0, node.lineno - 3) : node.end_lineno])
        if "#" not in context and "lazily" not in context:
            silent.append(f"line {node.lineno} in {func}(): {lines[node.lineno - 1].strip()}")
    assert not silent, "say why the import waits (# deferred: ...):\n" + "\n".join(silent)


# --- the stages ---------------------------------------------------------------------------------

STAGES = PACKAGE / "stages"
# the stages' shared parts, which any stage may import: none of them is a stage
STAGE_HELPERS = frozenset(
    {"stage", "rundir", "run_facts", "data_jobs", "markers", "sft_variants", "__init__"}
)


def stage_modules() -> list[Path]:
    return sorted(p for p in STAGES.glob("*.py") if p.stem not in STAGE_HELPERS)


@pytest.mark.parametrize("path", stage_modules(), ids=lambda p: p.stem)
def test_no_stage_module_imports_another(path: Path):
    """What a stage reads of another's output is asked of hanlm.stages.run_facts."""
    wrong = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "hanlm.stages":
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hanlm.stages."):
            names = [node.module.split(".")[2]]
        else:
            continue
        wrong += [f"line {node.lineno}: {n}" for n in names if n not in STAGE_HELPERS]
    assert not wrong, f"{path.stem} imports stage modules:\n" + "\n".join(wrong)


def test_every_stage_is_one_declaration():
    """The pipeline finds no hook by hasattr: each stage module ends in STAGE = Stage(...), which
    names its build (or its Rerun) and its hooks."""
    from hanlm import pipeline
    from hanlm.stages.stage import Stage

    assert "hasattr(" not in (PACKAGE / "pipeline.py").read_text()
    for name in [*pipeline.STAGES, "demo"]:
        stage = pipeline.declaration(name)
        assert isinstance(stage, Stage) and stage.name == name
        assert (stage.build is None) != (stage.rerun is None)
