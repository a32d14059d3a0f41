"""The corpus stage on the same documents written as parquet and as JSONL, side by side.

The documents are FineWeb-2-shaped rows (benchmarks/corpus_sources.py's generator: its columns,
10,000-row groups, zstd) of real Korean sentences from `../shared/data`; the JSONL files hold the
same rows, one JSON object a line, file for file. Each figure is `python -m hanlm corpus`, one
worker, in a subprocess wrapped as benchmarks/corpus.py wraps it, in each of the plan's three
settings (near-dedup on; off; on with `[corpus.quality]`), the two formats alternating run by
run; MB/s is the text's UTF-8 bytes over the wall time (the same bytes for both formats). The
medians are the plan's per-format corpus rates (hanlm/plan/data_rates.py: `corpus`,
`corpus_near_dedup`, `corpus_near_dedup_quality` for JSONL and plain text, each with a
`_parquet` twin). Target: parquet at least as fast as JSONL per worker.

    python benchmarks/corpus_formats.py [--mb 128] [--files 4] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DATA_VERSION = 1  # bump when the generator changes: the cache key
# the plan's corpus rates (hanlm/plan/data_rates.py): (corpus.near_dedup, corpus.quality.enabled)
SETTINGS = {
    "corpus_near_dedup": (True, False),
    "corpus": (False, False),
    "corpus_near_dedup_quality": (True, True),
}


def recipe(files: list[Path], near_dedup: bool, quality: bool) -> str:
    listed = ", ".join(json.dumps(str(p)) for p in files)
    text = f"[corpus]\nnear_dedup = {str(near_dedup).lower()}\ninputs = [{listed}]\n"
    return text + ("\n[corpus.quality]\nenabled = true\n" if quality else "")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(sources, bench, data: Path, mb: float, files: int, out: Path) -> tuple[list, list]:
    """(parquet files, JSONL files) of the same rows, built once into `out`."""
    import pyarrow.parquet as pq

    parquet = sorted((out / "fineweb-2" / "data" / "kor_Hang" / "train").glob("*.parquet"))
    jsonl = sorted((out / "jsonl").glob("*.jsonl"))
    if parquet and len(parquet) == len(jsonl):
        return parquet, jsonl
    shutil.rmtree(out, ignore_errors=True)
    sources.build_fineweb(bench, data, mb / 1000, files, out / "fineweb-2")
    parquet = sorted((out / "fineweb-2" / "data" / "kor_Hang" / "train").glob("*.parquet"))
    (out / "jsonl").mkdir()
    for path in parquet:
        rows = pq.read_table(path).to_pylist()
        target = out / "jsonl" / f"{path.stem}.jsonl"
        with open(target.with_suffix(".tmp"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        target.with_suffix(".tmp").replace(target)
    return parquet, sorted((out / "jsonl").glob("*.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=128.0, help="MB of text")
    parser.add_argument("--files", type=int, default=4, help="files of each format")
    parser.add_argument("--repeats", type=int, default=3, help="runs per format, alternating")
    parser.add_argument("--data", type=Path, default=SHARED, help="the shared Korean data sets")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "hanlm-bench")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"corpus_formats benchmark: {args.data} is missing (the shared Korean data)")
    sys.path.insert(0, str(ROOT))
    bench, sources = _load("corpus"), _load("corpus_sources")
    key = f"formats-v{DATA_VERSION}-{args.mb:g}mb-{args.files}f"
    parquet, jsonl = build(sources, bench, args.data, args.mb, args.files, args.cache / key)
    import pyarrow.parquet as pq

    text_mb = sum(len(t.encode("utf-8")) for p in parquet
                  for t in pq.read_table(p, columns=["text"]).column(0).to_pylist()) / 1e6  # fmt: skip
    print(f"{text_mb:.1f} MB of text in {len(parquet)} parquet files "
          f"({sum(p.stat().st_size for p in parquet) / 1e6:.1f} MB on disk) and the same rows in "
          f"{len(jsonl)} JSONL files ({sum(p.stat().st_size for p in jsonl) / 1e6:.1f} MB)")  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="hanlm-formats-"))
    figures: dict = {"text_mb": text_mb, "settings": {}}
    for rate, (near_dedup, quality) in SETTINGS.items():
        runs: dict[str, list[dict]] = {"parquet": [], "jsonl": []}
        ids: dict[str, list] = {}
        for _ in range(args.repeats):
            for name, files in (("parquet", parquet), ("jsonl", jsonl)):
                load = os.getloadavg()[0]
                run = sources.run_corpus(bench, recipe(files, near_dedup, quality), work, 1)
                runs[name].append(run)
                ids[name] = sorted(doc_id for doc_id, _ in run["documents"])
                print(f"  {rate}, {name}: {run['wall_s']:.2f} s wall, {run['cpu_s']:.2f} CPU-s, "
                      f"{text_mb / run['wall_s']:.2f} MB/s (load before {load:.2f})", flush=True)  # fmt: skip
        mb_s = {k: statistics.median(text_mb / r["wall_s"] for r in v) for k, v in runs.items()}
        figures["settings"][rate] = {
            "mb_per_s": mb_s,
            "parquet_over_jsonl": mb_s["parquet"] / mb_s["jsonl"],
            "same_documents": ids["parquet"] == ids["jsonl"],
            "walls": {k: [round(r["wall_s"], 2) for r in v] for k, v in runs.items()},
        }
    shutil.rmtree(work, ignore_errors=True)
    print(f"\nMB/s per worker, median of {args.repeats} ({text_mb:.0f} MB, one worker):")
    for rate, f in figures["settings"].items():
        ratio = f["parquet_over_jsonl"]
        print(f"  {rate:26s} parquet {f['mb_per_s']['parquet']:6.2f}  JSONL "
              f"{f['mb_per_s']['jsonl']:6.2f}  parquet / JSONL x{ratio:.2f} "
              f"{'PASS' if ratio >= 1 else 'FAIL'} (>= 1); same documents: "
              f"{f['same_documents']}")  # fmt: skip
    print(f"({os.cpu_count()} CPU cores, python {sys.version.split()[0]})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
