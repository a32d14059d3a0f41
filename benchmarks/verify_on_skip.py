"""What the run-folder lock and the full verification of reused outputs cost.

Side by side in one run: `hanlm run --until shards` on a finished demo-size run (every stage
up to date, so the command only checks and skips) as hanlm runs it, against the same command
with the lock taken away and every reused output checked by size only (what hanlm did before
issue 29). Each is a fresh process, as a user runs it (the same wrapper starts both);
repetitions alternate between the two; the medians and their ratio are printed (target: at
most 1.02).

Then what verification costs at scale, measured rather than guessed: sha256 throughput on this
machine over files of `--file-mb` (one thread, and the verifier's threads over several files,
as a stage's parts are hashed), extrapolated to 100 GB of reused outputs (corpus parts, shards,
an export), and the cost of taking and releasing the lock.

    python benchmarks/verify_on_skip.py [--repeats 7] [--file-mb 256] [--files 4] [--run DIR]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from unittest import mock

from hanlm import files, run_lock
from hanlm.cli import main

GB = 1e9


def size_only(folder, records):
    """The baseline's check of reused outputs: sizes only, as before issue 29."""
    return [
        p
        for r in records
        if (p := files.file_mismatch(Path(folder) / r["path"], r, checksum=False))
    ]


@contextlib.contextmanager
def baseline():
    with (
        mock.patch("hanlm.files.damaged_files", size_only),
        mock.patch("hanlm.data.corpus.damaged_files", size_only),
        mock.patch("hanlm.data.shards.damaged_files", size_only),
        mock.patch("hanlm.run_lock.hold", lambda *a, **k: contextlib.nullcontext()),
        mock.patch("hanlm.pipeline.run_lock.hold", lambda *a, **k: contextlib.nullcontext()),
    ):
        yield


def run_once(run_dir: str, mode: str) -> int:
    """One `hanlm run --until shards` in this process, as hanlm runs it or as the baseline."""
    with baseline() if mode == "baseline" else contextlib.nullcontext():
        return main(["run", "--run", run_dir, "--until", "shards"])


def time_run(run_dir: Path, mode: str = "hanlm") -> float:
    """Wall seconds of the command as a user runs it: a fresh process, imports included."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--one", mode, str(run_dir)], capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{mode} run exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def skip_checks(run_dir: Path) -> None:
    """What the data stages check before they skip (the same calls, in the same order)."""
    from hanlm.data import corpus, shards, tokenizer
    from hanlm.data.decontam import outputs

    assert not corpus.damaged_parts(run_dir / "corpus")
    assert not corpus.damaged_parts(run_dir / "decontam" / "corpus")
    assert not outputs.damaged_index(run_dir / "decontam" / outputs.INDEX_FILE)
    assert tokenizer.damage(run_dir / "tokenizer") is None
    assert not shards.damaged_outputs(run_dir / "shards")


def added_seconds(run_dir: Path, repeats: int = 21) -> float:
    """Median seconds the full checks and the lock add over size checks without a lock,
    measured in this process (free of the start-up and load noise of whole commands)."""

    def median_of(fn) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    def with_lock() -> None:
        with run_lock.hold(run_dir, "benchmark"):
            skip_checks(run_dir)

    ours = median_of(with_lock)
    with baseline():
        theirs = median_of(lambda: skip_checks(run_dir))
    return ours - theirs


def reused_bytes(run_dir: Path) -> int:
    return sum(
        p.stat().st_size
        for stage in ("corpus", "decontam", "tokenizer", "shards")
        for p in (run_dir / stage).rglob("*")
        if p.is_file()
    )


def hash_rates(folder: Path, file_mb: int, count: int) -> tuple[float, float]:
    """(MB/s on one thread over one file, MB/s over `count` files with the verifier's pool)."""
    block = os.urandom(1 << 20)
    paths = []
    for i in range(count):
        path = folder / f"part-{i}.bin"
        with open(path, "wb") as f:
            for _ in range(file_mb):
                f.write(block)
        paths.append(path)
    records = [files.file_record(p) | {"path": p.name} for p in paths]  # warms the page cache
    started = time.perf_counter()
    files.file_sha256(paths[0])
    one = file_mb / (time.perf_counter() - started)
    started = time.perf_counter()
    assert files.damaged_files(folder, records) == []
    pooled = file_mb * count / (time.perf_counter() - started)
    return one, pooled


def lock_seconds(folder: Path, repeats: int = 200) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        with run_lock.hold(folder, "benchmark"):
            pass
    return (time.perf_counter() - started) / repeats


def main_benchmark() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--file-mb", type=int, default=256)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--run", type=Path, help="a finished run to reuse (default: made here)")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "RUN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        raise SystemExit(run_once(args.one[1], args.one[0]))

    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run or Path(scratch) / "demo"
        print(f"data stages of the demo recipe in {run_dir} ...", flush=True)
        time_run(run_dir)  # builds what is missing; then every stage is up to date
        time_run(run_dir)  # warm: imports, page cache
        ours, before = [], []
        for _ in range(args.repeats):
            ours.append(time_run(run_dir))
            before.append(time_run(run_dir, "baseline"))
        mine, theirs = statistics.median(ours), statistics.median(before)
        size = reused_bytes(run_dir)
        print(
            f"\nup-to-date `hanlm run --until shards` ({size / 1e6:.1f} MB of outputs reused), "
            f"median of {args.repeats}:"
        )
        print(f"  size checks, no lock (before): {theirs:.3f} s")
        print(f"  sha256 checks + lock (hanlm):  {mine:.3f} s")
        print(
            f"  ratio: {mine / theirs:.3f} (target <= 1.02); "
            f"spread {min(ours):.3f}-{max(ours):.3f} s vs {min(before):.3f}-{max(before):.3f} s"
        )

        added = added_seconds(run_dir)
        print(
            f"  added work measured in-process (checksums of every reused output + the lock): "
            f"{added * 1e3:.1f} ms, i.e. {added / theirs:.2%} of the baseline's {theirs:.1f} s"
        )

        one, pooled = hash_rates(Path(scratch), args.file_mb, args.files)
        lock = lock_seconds(Path(scratch) / "locked")
        print(
            f"\nsha256 on this machine ({args.files} files of {args.file_mb} MB, page cache warm):"
        )
        print(
            f"  one thread: {one:,.0f} MB/s; {files.VERIFY_THREADS}-thread pool over "
            f"{args.files} files: {pooled:,.0f} MB/s"
        )
        print(
            f"  100 GB of reused outputs: {100 * GB / 1e6 / pooled:,.0f} s at that rate "
            f"(a disk slower than {pooled:,.0f} MB/s sets the pace instead: "
            f"{100 * GB / 1e6 / 2000:,.0f} s at 2 GB/s NVMe, {100 * GB / 1e6 / 200:,.0f} s "
            "at 200 MB/s network storage)"
        )
        print(f"lock: {lock * 1e6:,.0f} us to take and release")


if __name__ == "__main__":
    main_benchmark()
