from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _share_the_cores() -> None:
    """Under pytest-xdist each worker computes with its share of the cores (and so do the
    processes its tests start): torch's OpenMP threads spin while they wait for each other, so
    two workers of two threads each on two cores run a tiny model's steps several times slower
    than one thread each. A count the user set is left alone; tests that need a count set it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


_share_the_cores()  # before torch starts its thread pool (hanlm.cli below imports it)

import pytest  # noqa: E402

from hanlm.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# helpers (tests/README.md): a test imports a helper by name (`import leaks`)
SUPPORT = Path(__file__).resolve().parent / "support"
# the scripts tests run in processes of their own; a test also imports a rank module's one-process
# reference by name (`import lora_ranks`)
WORKERS = Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(SUPPORT))
sys.path.insert(0, str(WORKERS))

# Tests never reach the network: a `hf:` input must fail fast with its offline message.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# a trusted model's own code is copied into transformers' modules cache: the session's, not ~'s
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="hanlm-hf-modules-"))
# SkyPilot lives in an environment of its own (scripts/setup.sh --dev makes .venv-sky): the
# launch tests check their tasks with its parser
if (ROOT / ".venv-sky" / "bin" / "python").is_file():
    os.environ.setdefault("HANLM_SKYPILOT_PYTHON", str(ROOT / ".venv-sky" / "bin" / "python"))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real Korean data not present at {SHARED_DATA}")
    return SHARED_DATA


def korquad_contexts(shared: Path) -> list[str]:
    data = json.loads((shared / "korquad" / "KorQuAD_v1.0_dev.json").read_text(encoding="utf-8"))
    return [p["context"] for article in data["data"] for p in article["paragraphs"]]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(capsys):
    """Run `hanlm ARGS` in-process; returns exit code and captured output."""

    def run(*args: str) -> CliResult:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def run_subprocess(*args: str, cwd: Path | None = None, timeout: int = 300):
    """Run `python -m hanlm ARGS` as a user would: a real process, real exit code and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "hanlm", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def run_two_rank_worker(worker: Path, out: Path, *args: str, timeout: int = 300):
    """`worker OUT ARGS...` under torchrun on 2 CPU ranks, one thread each (the cores are two)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(worker), str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def assert_close(got, expected, rtol: float = 1e-5) -> None:
    """Tensors equal within `rtol` of the expected one's largest magnitude."""
    scale = expected.abs().max().item()
    assert scale > 0, "a reference that is all zeros tests nothing"
    worst = (got - expected).abs().max().item()
    assert worst <= rtol * scale, f"off by {worst:.3g} of {scale:.3g}"


def assert_user_error(result, *needles: str) -> None:
    """Exit status 2, a one-paragraph message, no traceback."""
    code = result.returncode if hasattr(result, "returncode") else result.code
    err = result.stderr if hasattr(result, "stderr") else result.err
    assert code == 2, f"exit {code}, stderr: {err}"
    assert "Traceback" not in err
    assert "error:" in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


# Tiny pretraining for tests: a step is 512 tokens (2 micro-batches of 4 x 64 in one process,
# one per rank with two ranks); checkpoints every 4 steps.
TINY_PRETRAIN = {
    "model.preset": "tiny",
    "pretrain.seq_len": 64,
    "pretrain.micro_batch": 4,
    "pretrain.global_batch_tokens": 512,
    "pretrain.max_steps": 8,
    "optimizer.lr": 1e-2,
    "optimizer.warmup_steps": 2,
    "precision.mode": "fp32",
    "logging.log_every": 1,
    "logging.eval_every": 4,
    "logging.eval_batches": 2,
    "checkpoint.every": 4,
}


def metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "pretrain" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def checkpoint_weights(folder: Path) -> dict:
    """The model tensors a DCP checkpoint folder holds, read in this one process (however many
    ranks wrote it)."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(folder)),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def trained_and_exported(demo_run: Path, run_dir: Path, values: dict) -> Path:
    """A tiny model pretrained (in this process) on a copy of the demo data run with `values`,
    exported to RUN/pretrain/hf; that folder."""
    from hanlm.pipeline import run_stage
    from hanlm.stages import export
    from hanlm.stages.rundir import load_run_config

    copy_data_run(demo_run, run_dir)
    cfg = load_run_config(run_dir, values=values)
    run_stage("pretrain", cfg, run_dir)
    out = run_dir / "pretrain" / "hf"
    export.export_chosen(cfg, run_dir, checkpoint=None, out=out, force=False)
    return out


def copy_data_run(source: Path, target: Path) -> Path:
    """A copy of a finished data run (corpus, tokenizer, shards) without any training."""
    import shutil

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("pretrain"))
    return target


# The settings of the `demo_run` fixture's run.
DEMO_RUN_VALUES = {
    "demo.size_mb": 0.4,
    # the world these tests were written on (the recipe's reverse statements change the text the
    # tiny models learn; tests/integration/test_run.py runs the recipe's own world)
    "demo.reverse_share": 0.0,
    "corpus.part_chars": 40_000,
    "tokenizer.vocab_size": 1024,
    "data_engine.workers": 2,
    "shards.val_fraction": 0.02,
    # the demo recipe keeps contaminated documents (to measure them); tests check dropping
    "decontam.action": "drop",
}


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """A small finished corpus -> tokenizer -> shards run on the demo world, shared read-only."""
    from hanlm.config import load_config
    from hanlm.pipeline import run_pipeline

    run_dir = tmp_path_factory.mktemp("demo_run")
    run_pipeline(load_config(values=DEMO_RUN_VALUES), run_dir, until="shards")
    return run_dir


# KoBEST: each task's shared-data folder.
KOBEST_FOLDERS = {
    "kobest_boolq": "BoolQ",
    "kobest_copa": "COPA",
    "kobest_hellaswag": "HellaSwag",
    "kobest_sentineg": "SentiNeg",
    "kobest_wic": "WiC",
}


def kobest_as_published(tsv: Path, task: str):
    """skt/kobest_v1's split as its publisher built it from `tsv` (tests/support/kobest_reference.py);
    the test skips without pandas and datasets (dev-only dependencies)."""
    pytest.importorskip("pandas")
    pytest.importorskip("datasets")
    from kobest_reference import publish

    return publish(tsv, task)


# -- scheduling: the slowest files first -----------------------------------------------------------
#
# Under `--dist loadfile` a file runs on one worker; left in pytest-xdist's order (most tests
# first) the few-test files that start several processes ran last, one worker idle while the
# other finished them. scripts/test.sh keeps the collection order (--no-loadscope-reorder) and
# this puts the files that took longest in the last full run first (pytest's cache, written
# below), else these, measured 2026-12-05 (a fresh clone, as CI runs, has no cache), else those
# with a test marked slow.
SLOW_FILES = (
    "tests/integration/test_rehearse.py",
    "tests/integration/test_launch.py",
    "tests/integration/test_run.py",
    "tests/integration/test_decontam.py",
    "tests/integration/test_sft_foreign.py",
    "tests/integration/test_resume_exact.py",
    "tests/integration/test_benchmarks_smoke.py",
    "tests/integration/test_sft.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_pretrain.py",
    "tests/integration/test_hosts.py",
    "tests/integration/test_corpus_engine.py",
    "tests/integration/test_optimizer_benchmark.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_determinism.py",
    "tests/integration/test_lora_benchmark.py",
    "tests/integration/test_serve.py",
    "tests/integration/test_checkpoint.py",
)
FILE_SECONDS = "hanlm/file-seconds"


def pytest_collection_modifyitems(config, items):
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    measured = cache.get(FILE_SECONDS, {}) if cache is not None else {}

    def rank(path: str) -> tuple:
        if path in measured:
            return (0, -measured[path])
        if path in SLOW_FILES:
            return (1, SLOW_FILES.index(path))
        return (2, 0)

    files = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        slow = item.get_closest_marker("slow") is not None
        files[path] = files.get(path, False) or slow
    order = sorted(files, key=lambda p: (*rank(p), not files[p]))
    position = {path: i for i, path in enumerate(order)}
    items.sort(key=lambda item: position[item.nodeid.split("::", 1)[0]])


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """The files' times, for the next run's order: from a whole run only (not a -k or a file)."""
    config = session.config
    whole = not config.option.keyword and not config.option.markexpr and not config.args[1:]
    if hasattr(config, "workerinput") or getattr(config, "cache", None) is None or not whole:
        return
    if len(_file_seconds) > 50:
        config.cache.set(FILE_SECONDS, {p: round(s, 1) for p, s in _file_seconds.items()})
