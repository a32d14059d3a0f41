"""The data stages on one huge single-line document: peak memory (RSS) and time per stage.

Issue 29: a 200 MB single-line document took `hanlm shards` to ~21 GB of RSS on a 24 GB machine
(HF tokenizers' `encode` of one 200 MB string). This script builds a run whose input is one
generated document of `--mb` MB (Korean-like text: words of common Hangul syllables drawn with
Zipf frequencies, sentences ending in `다.`, no line break anywhere) plus `--small` ordinary
documents, and runs the data stages as a user would, each `python -m hanlm STAGE --run RUN` in a
subprocess: corpus (quality filters and near-dedup on), decontam (the demo world's benchmark:
the demo world is an input too), tokenizer, shards. Nothing is downloaded.

Per stage: wall seconds, and peak RSS two ways. A fresh wrapper process starts the stage and
waits for it: `getrusage(RUSAGE_CHILDREN).ru_maxrss` in the wrapper is the largest peak of any
one process of the stage's tree (the stage's process or a datatrove worker; exact, not sampled),
and the wrapper samples the tree's summed RSS with psutil every 0.1 s (what the machine holds
while workers run side by side). Target: every stage's summed peak under `--target-gb` (2 GB).

    python benchmarks/huge_document.py [--mb 200] [--small 2000] [--workers 2]
        [--set KEY=VALUE ...] [--stages corpus,decontam,tokenizer,shards] [--cache DIR]
        [--run DIR] [--json OUT]

`--set corpus.max_document_chars=0` keeps the huge document whole through the corpus stage, so
that the later stages get it in one piece (the corpus stage itself then needs memory in
proportion to it: the quality checks and MinHash work on the whole text).
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("corpus", "decontam", "tokenizer", "shards")
GB = 1 << 30

# Common Hangul syllables: the words of the generated text are 1-4 of them.
SYLLABLES = (
    "가나다라마바사아자차카타파하고노도로모보소오조초코토포호구누두루무부수우주추쿠투푸후"
    "그느드르므브스으즈츠크트프흐기니디리미비시이지치키티피히한국서울대학교사람시간문제생각"
    "정부경제사회문화역사세계지역기업시장정치국가교육기술개발연구관계방법결과과정상황환경"
    "조사자료내용영향의미"
)
PARTICLES = ["은", "는", "이", "가", "을", "를", "에", "의", "로", "와", "에서", "으로"]


@functools.cache
def _vocabulary(size: int = 30_000) -> np.ndarray:
    rng = np.random.default_rng(0)
    syllables = np.array(list(SYLLABLES))
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables, rng.integers(1, 5))))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return np.array(ordered + PARTICLES)


def korean_like(chars: int, seed: int, chunk_words: int = 200_000):
    """Chunks of generated text (one line, no line break) of about `chars` characters in all:
    Zipf-distributed words, a sentence end (`다.`) after about one word in ten."""
    rng = np.random.default_rng(seed)
    words = _vocabulary()
    p = 1.0 / np.arange(1, len(words) + 1) ** 1.05
    p /= p.sum()
    done = 0
    while done < chars:
        n = min(chunk_words, max(1, (chars - done) // 3))
        picked = words[rng.choice(len(words), n, p=p)].tolist()
        ends = rng.random(n) < 0.1
        text = " ".join(w + "다." if e else w for w, e in zip(picked, ends, strict=True))
        text = text[: chars - done]
        done += len(text) + 1
        yield text + ("다." if done >= chars else " ")


def write_huge(path: Path, mb: float, seed: int = 1) -> None:
    """One JSONL record, `id` "huge", whose text is `mb` MB (10^6 bytes) of UTF-8 on one line."""
    tmp = path.with_suffix(".tmp")
    target = int(mb * 1e6)
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        f.write('{"id": "huge", "text": "')
        for chunk in korean_like(target, seed):  # characters: more than enough bytes
            data = chunk.encode("utf-8")[: target - written].decode("utf-8", "ignore")
            f.write(data)  # no quote, backslash or control character: valid JSON as it is
            written += len(data.encode("utf-8"))
            if written >= target - 3:
                break
        f.write('"}\n')
    os.replace(tmp, path)


def write_small(path: Path, count: int, seed: int = 2) -> None:
    """`count` ordinary documents of 300-3,000 characters, in 1-4 lines."""
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(count):
            lines = [
                "".join(korean_like(int(rng.integers(100, 800)), seed * 100_000 + i * 8 + j))
                for j in range(int(rng.integers(1, 5)))
            ]
            f.write(json.dumps({"id": f"small-{i}", "text": "\n".join(lines)}, ensure_ascii=False))
            f.write("\n")
    os.replace(tmp, path)


RECIPE = """\
[corpus]
min_chars = 200
near_dedup = true

[corpus.quality]
enabled = true

[decontam]
benchmarks = ["demo_qa=demo"]
action = "drop"

[tokenizer]
vocab_size = 8192

[data_engine]
workers = {workers}
"""

# Runs one stage and waits for it: RUSAGE_CHILDREN's ru_maxrss is then the largest peak of any
# process of the stage's tree; psutil samples the tree's summed RSS.
WRAPPER = r"""
import json, resource, subprocess, sys, time
cmd, log, interval = json.loads(sys.argv[1])
try:
    import psutil
except ImportError:
    psutil = None
with open(log, "wb") as out:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    root = psutil.Process(p.pid) if psutil else None
    peak = 0
    while True:
        try:
            p.wait(timeout=interval)
            break
        except subprocess.TimeoutExpired:
            pass
        if root is None:
            continue
        total = 0
        try:
            for q in [root, *root.children(recursive=True)]:
                try:
                    total += q.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
    wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "wall_s": wall, "maxrss_bytes": ru.ru_maxrss * 1024,
                  "tree_peak_bytes": peak if psutil else None}))
"""


def run_stage(stage: str, run: Path, recipe: Path, sets: list[str], inputs: list[Path]) -> dict:
    cmd = [sys.executable, "-m", "hanlm", stage, "--run", str(run), "--config", str(recipe)]
    if stage == "corpus":
        for path in inputs:
            cmd += ["--input", str(path)]
        cmd += ["--input", "demo"]
    for value in sets:
        cmd += ["--set", value]
    log = run / f"{stage}.log"
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, json.dumps([cmd, str(log), 0.1])],
        capture_output=True,
        text=True,
        cwd=run,
    )
    if out.returncode != 0:
        raise SystemExit(f"the wrapper failed: {out.stderr}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    if figures["rc"] != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"`hanlm {stage}` exited {figures['rc']}:\n{tail}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the huge document (MB)")
    ap.add_argument("--small", type=int, default=2000, help="ordinary documents beside it")
    ap.add_argument("--workers", type=int, default=2, help="data_engine.workers")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every stage (e.g. corpus.max_document_chars=0)")  # fmt: skip
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--target-gb", type=float, default=2.0)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/hanlm-bench/huge")
    ap.add_argument("--run", type=Path, help="run folder (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    if unknown := set(stages) - set(STAGES):
        ap.error(f"unknown stages {sorted(unknown)}; choose from {', '.join(STAGES)}")

    args.cache.mkdir(parents=True, exist_ok=True)
    huge = args.cache / f"huge-{args.mb:g}mb.jsonl"
    small = args.cache / f"small-{args.small}.jsonl"
    for path, make in ((huge, lambda: write_huge(huge, args.mb)),
                       (small, lambda: write_small(small, args.small))):  # fmt: skip
        if not path.is_file():
            started = time.perf_counter()
            make()
            print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, "
                  f"{time.perf_counter() - started:.0f} s)")  # fmt: skip
    inputs = [huge, small]

    scratch = None
    if args.run is None:
        scratch = Path(tempfile.mkdtemp(prefix="hanlm-huge-"))
        run = scratch / "run"
    else:
        run = args.run
        shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    recipe = run / "bench.toml"
    recipe.write_text(RECIPE.format(workers=args.workers), "utf-8")
    print(f"input: {huge.name} {huge.stat().st_size / 1e6:.1f} MB (one line), "
          f"{small.name} {small.stat().st_size / 1e6:.1f} MB; run {run}; "
          f"workers {args.workers}; --set {args.set}")  # fmt: skip
    results = {}
    try:
        for stage in stages:
            figures = run_stage(stage, run, recipe, args.set, inputs)
            results[stage] = figures
            tree = figures["tree_peak_bytes"]
            ok = "yes" if max(tree or 0, figures["maxrss_bytes"]) < args.target_gb * GB else "NO"
            print(f"{stage:10s} wall {figures['wall_s']:7.1f} s   largest process "
                  f"{figures['maxrss_bytes'] / GB:5.2f} GiB   tree (summed) "
                  f"{(tree or 0) / GB:5.2f} GiB   under {args.target_gb:g} GiB: {ok}",
                  flush=True)  # fmt: skip
        stats_path = run / "corpus" / "stats.json"
        if stats_path.is_file():
            stats = json.loads(stats_path.read_text())
            keys = ("documents_in", "documents_out", "characters_out", "long_documents",
                    "skipped", "quality_filtered")  # fmt: skip
            print("corpus:", json.dumps({k: stats.get(k) for k in keys}, ensure_ascii=False))
        manifest_path = run / "shards" / "manifest.json"
        if manifest_path.is_file():
            m = json.loads(manifest_path.read_text())
            print("shards:", {s: m["splits"][s]["tokens"] for s in ("train", "val")}, "tokens")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "stages": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
