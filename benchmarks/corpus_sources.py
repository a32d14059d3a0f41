"""The field's sources as hanlm reads them: a FineWeb-2-shaped dataset repository (>= 1 GB of
Korean text in parquet) read through a local snapshot by `hf:`, against the same files by glob.

benchmarks/corpus.py measures the corpus stage on JSONL files; this script measures it on
dataset repositories as the Hub holds them, each figure from `python -m hanlm corpus` in a
subprocess:

1. snapshot vs glob: `hf:SNAPSHOT:kor_Hang:train` and `SNAPSHOT/data/kor_Hang/train/*.parquet`,
   one worker each, alternating: MB/s per worker (target: within 10%), and the same documents;
2. 1 -> 2 workers on the snapshot (target: x1.8);
3. the near-duplicate pairs job's tasks for the whole snapshot (target: more than one), and
   the corpus stage's tasks (row groups of data_engine.task_mb);
4. peak RSS of the stage's largest process at half and at the full snapshot (target: flat,
   within 10%);
5. `read = "needed"`: a recipe mixing the FineWeb-2-shaped source (95%) and a Wikipedia-shaped
   one (5%) with a budget whose web share needs about a third of the snapshot: the characters
   read over what the mix takes (its share x chars_per_token; target <= 1.5), the tasks drawn,
   and the Wikipedia-shaped source read whole;
6. the Wikipedia-shaped snapshot (`hf:WIKI:20231101.ko:train`, KorQuAD's Wikipedia contexts)
   read by id and by glob: the same documents, and the download commit recorded.

The text is built from the real Korean sentences in `../shared/data` as benchmarks/corpus.py
builds its documents (distinct by construction), never from the repository. FineWeb-2's columns
(id, url, dump, date, language_score, ...) and layout (data/kor_Hang/train/NNN_00000.parquet,
configs in the README, the commit in .cache/huggingface/) are kept, so the snapshot is what
`hf download HuggingFaceFW/fineweb-2 --repo-type dataset --include "data/kor_Hang/train/*"
--local-dir DIR` leaves.

    python benchmarks/corpus_sources.py [--gb 1.0] [--files 8] [--repeats 1] [--cache DIR]
        [--json OUT]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import importlib.util
import json
import random
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
COMMIT = "4f1e2a9c0b7d8e6f5a4b3c2d1e0f9a8b7c6d5e4f"  # what the snapshot's .cache records
ROWS_PER_GROUP = 10_000
DATA_VERSION = 1  # bump when the generator changes: the cache key


def _corpus_bench():
    """benchmarks/corpus.py, for its sentence pool, documents and measuring wrapper."""
    spec = importlib.util.spec_from_file_location("corpus_bench", ROOT / "benchmarks" / "corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_snapshot_metadata(root: Path, files: list[Path]) -> None:
    for path in files:
        meta = root / ".cache" / "huggingface" / "download" / path.relative_to(root)
        meta = meta.with_name(meta.name + ".metadata")
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{COMMIT}\netag\n1764800000.0\n")


def build_fineweb(bench, data: Path, gb: float, files: int, out: Path) -> dict:
    """A FineWeb-2-shaped snapshot of about `gb` GB of text in `files` parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pool = bench.sentence_pool(data)
    rng = random.Random(0)
    folder = out / "data" / "kor_Hang" / "train"
    folder.mkdir(parents=True)
    (out / "README.md").write_text(
        "---\nconfigs:\n- config_name: kor_Hang\n  data_files:\n"
        "  - split: train\n    path: data/kor_Hang/train/*\n"
        "  - split: test\n    path: data/kor_Hang/test/*\n---\n# FineWeb-2 (shape)\n"
    )
    per_file = gb * 1e9 / files
    written, made, n = [], 0, 0
    for f in range(files):
        rows, size = [], 0
        while size < per_file:
            text = bench.render(bench.new_document(rng, len(pool)), pool)
            size += len(text.encode("utf-8"))
            rows.append({
                "text": text, "id": f"<urn:uuid:{n:032x}>", "dump": "CC-MAIN-2024-10",
                "url": f"https://site{rng.randrange(5000)}.example.kr/{n}",
                "date": "2024-02-21T10:00:00Z", "file_path": f"s3://commoncrawl/{n % 97}.warc.gz",
                "language": "kor", "language_score": round(0.6 + 0.4 * rng.random(), 4),
                "language_script": "Hang", "minhash_cluster_size": 1 + rng.randrange(3),
            })  # fmt: skip
            n += 1
        path = folder / f"{f:03d}_00000.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=ROWS_PER_GROUP,
                       compression="zstd")  # fmt: skip
        written.append(path)
        made += size
        print(f"  fineweb-shaped {f + 1}/{files}: {made / 1e9:.2f} GB", file=sys.stderr)
    _write_snapshot_metadata(out, written)
    return {"bytes": made, "documents": n, "files": len(written)}


def build_wikipedia(data: Path, out: Path) -> dict:
    """A Wikipedia-shaped snapshot (config 20231101.ko) of KorQuAD 1.0's Wikipedia articles."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    korquad = json.loads((data / "korquad" / "KorQuAD_v1.0_dev.json").read_text("utf-8"))
    rows = [
        {"id": str(i), "url": f"https://ko.wikipedia.org/wiki/{a['title']}", "title": a["title"],
         "text": "\n\n".join(p["context"] for p in a["paragraphs"])}
        for i, a in enumerate(korquad["data"])
    ]  # fmt: skip
    folder = out / "20231101.ko"
    folder.mkdir(parents=True)
    (out / "README.md").write_text(
        "---\nconfigs:\n- config_name: 20231101.ko\n  data_files:\n"
        "  - split: train\n    path: 20231101.ko/train-*\n---\n# Wikipedia (shape)\n"
    )
    half = len(rows) // 2
    written = []
    for i, part in enumerate((rows[:half], rows[half:])):
        path = folder / f"train-{i:05d}-of-00002.parquet"
        pq.write_table(pa.Table.from_pylist(part), path, row_group_size=20)
        written.append(path)
    _write_snapshot_metadata(out, written)
    return {"articles": len(rows), "bytes": sum(len(r["text"].encode()) for r in rows)}


def run_corpus(bench, recipe: str, work: Path, workers: int, extra: list[str] = ()) -> dict:
    """`hanlm corpus` on `recipe` (TOML text) in a fresh run folder, wrapped as
    benchmarks/corpus.py wraps it: wall time, the largest process's peak RSS, stats.json."""
    from hanlm.data.corpus import iter_corpus

    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "bench.toml").write_text(recipe, "utf-8")
    cmd = [sys.executable, "-m", "hanlm", "corpus", "--run", str(run), "--config",
           str(run / "bench.toml"), "--set", f"data_engine.workers={workers}", "--force", *extra]  # fmt: skip
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    log = work / "stage.log"
    out = subprocess.run([sys.executable, "-c", bench.WRAPPER,
                          json.dumps([cmd, str(work), env, str(log)])],
                         capture_output=True, text=True, check=True)  # fmt: skip
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    if figures["rc"] != 0:
        sys.exit(f"`hanlm corpus` failed:\n{log.read_text('utf-8', errors='replace')[-3000:]}")
    figures["stats"] = json.loads((run / "corpus" / "stats.json").read_text("utf-8"))
    figures["documents"] = [(d["id"], d["text"]) for d in iter_corpus(run / "corpus")]
    shutil.rmtree(run, ignore_errors=True)
    return figures


def flat_recipe(inputs: list[str]) -> str:
    listed = ", ".join(json.dumps(i) for i in inputs)
    return f"[corpus]\nnear_dedup = true\ninputs = [{listed}]\n"


def mix_recipe(web: str, wiki: str, budget_tokens: int) -> str:
    return (
        "[corpus]\nnear_dedup = true\n\n"
        f'[[corpus.sources]]\nname = "web"\ninputs = [{json.dumps(web)}]\nweight = 0.95\n'
        'metadata = ["url", "language_score"]\nmin_language_score = 0.65\n\n'
        f'[[corpus.sources]]\nname = "wiki"\ninputs = [{json.dumps(wiki)}]\nweight = 0.05\n'
        f"\n[pretrain]\nmax_tokens = {budget_tokens}\nglobal_batch_tokens = 65536\n"
    )


def pairs_tasks(spec: str) -> tuple[int, int, int]:
    """(corpus tasks, their bytes, pairs tasks) the stage makes of `spec` at the defaults."""
    from hanlm.config import load_config
    from hanlm.data import cleaning, readers

    cfg = load_config(values={"corpus.inputs": [spec], "corpus.near_dedup": True})
    units = readers.source_units(
        cfg.corpus.source_list(), cfg.corpus, cfg.data_engine.task_mb << 20
    )
    jobs = cleaning.jobs(units, cfg.corpus, 0, Path(tempfile.mkdtemp()), None)
    return len(units), sum(u.nbytes for u in units), jobs[1].tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="GB of text in the snapshot")
    parser.add_argument("--files", type=int, default=8, help="parquet files it is cut into")
    parser.add_argument("--repeats", type=int, default=1, help="runs per snapshot/glob timing")
    parser.add_argument("--data", type=Path, default=SHARED, help="the shared Korean data sets")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "hanlm-bench")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"corpus_sources benchmark: {args.data} is missing (the shared Korean data)")
    sys.path.insert(0, str(ROOT))
    bench = _corpus_bench()
    key = f"sources-v{DATA_VERSION}-{args.gb:g}gb-{args.files}f"
    snap, wiki = args.cache / key / "fineweb-2", args.cache / key / "wikipedia"
    if not (snap / "README.md").is_file():
        shutil.rmtree(args.cache / key, ignore_errors=True)
        print(f"building the snapshots in {args.cache / key} ...", file=sys.stderr)
        build_fineweb(bench, args.data, args.gb, args.files, snap)
        build_wikipedia(args.data, wiki)
    work = Path(tempfile.mkdtemp(prefix="hanlm-sources-"))
    hf_spec = f"hf:{snap}:kor_Hang:train"
    glob_spec = str(snap / "data" / "kor_Hang" / "train" / "*.parquet")
    tasks, text_bytes, pairs = pairs_tasks(hf_spec)
    mb = text_bytes / 1e6
    print(f"snapshot: {text_bytes / 1e9:.2f} GB of text in {args.files} files; corpus tasks "
          f"{tasks} (task_mb 64), near-duplicate pairs tasks {pairs}", file=sys.stderr)  # fmt: skip
    figures: dict = {"text_bytes": text_bytes, "corpus_tasks": tasks, "pairs_tasks": pairs}

    # 1. snapshot vs glob, alternating; 2. two workers
    rates: dict[str, list[float]] = {"hf": [], "glob": []}
    rss: dict[str, int] = {}
    documents = {}
    for _ in range(args.repeats):
        for name, spec in (("hf", hf_spec), ("glob", glob_spec)):
            run = run_corpus(bench, flat_recipe([spec]), work, 1)
            rates[name].append(mb / run["wall_s"])
            rss[name] = max(rss.get(name, 0), run["maxrss_kb"] * 1024)
            documents[name] = run["documents"]
            print(f"  {name}, 1 worker: {run['wall_s']:.1f} s, {mb / run['wall_s']:.1f} MB/s",
                  file=sys.stderr)  # fmt: skip
    two = run_corpus(bench, flat_recipe([hf_spec]), work, 2)
    figures["mb_per_s_per_worker"] = {k: statistics.median(v) for k, v in rates.items()}
    figures["hf_over_glob"] = (
        figures["mb_per_s_per_worker"]["hf"] / figures["mb_per_s_per_worker"]["glob"]
    )
    figures["same_documents"] = documents["hf"] == documents["glob"]
    figures["two_workers_mb_per_s"] = mb / two["wall_s"]
    figures["two_worker_speedup"] = (
        figures["two_workers_mb_per_s"] / figures["mb_per_s_per_worker"]["hf"]
    )

    # 4. memory at half and at the full snapshot
    half = sorted((snap / "data" / "kor_Hang" / "train").glob("*.parquet"))[: args.files // 2]
    half_run = run_corpus(bench, flat_recipe([str(p) for p in half]), work, 1)
    figures["peak_rss_half"] = half_run["maxrss_kb"] * 1024
    figures["peak_rss_full"] = rss["hf"]
    figures["rss_growth"] = figures["peak_rss_full"] / figures["peak_rss_half"] - 1

    # 5. read = "needed": the web share needs about a third of the snapshot
    per_token = 2.5 * 1.3  # corpus.chars_per_token x corpus.read_margin (the defaults)
    chars_held = sum(len(t) for _, t in documents["hf"]) or 1
    budget = int(chars_held / 3 / per_token / 0.95)
    needed = run_corpus(bench, mix_recipe(hf_spec, f"hf:{wiki}:20231101.ko:train", budget), work, 2)
    stats = needed["stats"]
    web_share = 0.95 * -(-budget // 65536) * 65536  # max_tokens in whole steps
    figures["needed"] = {
        "budget_tokens": budget,
        "web_tasks_read": stats["reads"]["web"]["tasks_read"],
        "web_tasks": stats["reads"]["web"]["tasks"],
        "web_characters_read": stats["sources"]["web"]["characters_in"],
        "web_share_characters": web_share * 2.5,
        "read_over_share": stats["sources"]["web"]["characters_in"] / (web_share * 2.5),
        "wiki_whole": stats["reads"]["wiki"]["whole"],
        "wall_s": needed["wall_s"],
    }

    # 6. the Wikipedia-shaped snapshot by id and by glob
    by_id = run_corpus(bench, flat_recipe([f"hf:{wiki}:20231101.ko:train"]), work, 1)
    by_glob = run_corpus(bench, flat_recipe([str(wiki / "20231101.ko" / "*.parquet")]), work, 1)
    figures["wikipedia"] = {
        "same_documents": by_id["documents"] == by_glob["documents"],
        "documents": len(by_id["documents"]),
        "revision": by_id["stats"]["revisions"],
    }
    shutil.rmtree(work, ignore_errors=True)

    n = figures["needed"]
    print(f"""
FineWeb-2-shaped snapshot, {text_bytes / 1e9:.2f} GB of text, {args.files} parquet files, near-dedup on
  MB/s per worker   hf: snapshot {figures['mb_per_s_per_worker']['hf']:.1f}  glob {figures['mb_per_s_per_worker']['glob']:.1f}  ratio {figures['hf_over_glob']:.3f} (target 0.90-1.10); same documents: {figures['same_documents']}
  2 workers         {figures['two_workers_mb_per_s']:.1f} MB/s: x{figures['two_worker_speedup']:.2f} (target x1.8)
  tasks             corpus {tasks} (row groups, task_mb 64); near-duplicate pairs {pairs} (target > 1)
  peak RSS          half {figures['peak_rss_half'] / 2**20:.0f} MiB, full {figures['peak_rss_full'] / 2**20:.0f} MiB: {figures['rss_growth']:+.1%} (target <= +10%)
  read = "needed"   web {n['web_tasks_read']} of {n['web_tasks']} tasks, {n['web_characters_read']:,} characters for a share of {n['web_share_characters']:,.0f}: x{n['read_over_share']:.2f} (target <= 1.5); wiki read whole: {n['wiki_whole']}
Wikipedia-shaped snapshot: {figures['wikipedia']['documents']} articles; by id = by glob: {figures['wikipedia']['same_documents']}; revision {figures['wikipedia']['revision']}""")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
