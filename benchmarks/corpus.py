"""`hanlm corpus` with near-dedup, end to end on >= 200 MB of Korean: speed, memory, recall.

Each measurement runs `python -m hanlm corpus --set corpus.near_dedup=true` as a subprocess on
a cached synthetic corpus (several JSONL files), timed by the wall clock, and reads the output
back to score the planted duplicates. The corpus is built from the real Korean paragraphs in
`../shared/data` (KorQuAD 1.0 dev contexts, the KoBEST passages and sentences, GSM8K-ko): they
are split into sentences, and every document is a new mix of 8-16 sentences drawn at random
from the whole pool, in 2-4 paragraphs, so documents are distinct by construction (the script
measures it: the most sentences any two documents share, and the 5-gram Jaccard of random
pairs). Planted, with known ids, each a copy of an earlier document: exact copies, and near
duplicates with punctuation changed throughout, with spacing changed, with one sentence appended,
with one sentence changed and with its paragraphs reordered.

Figures per run: input MB, wall s, MB/s, MB/s per worker, CPU s of the process tree, peak RSS,
recall (a planted pair counts when it collapsed to one document: either member may be the one
kept) and the false-positive rate (original documents removed, except an original whose planted
copy was kept instead). Peak RSS: a fresh wrapper process starts the stage and waits for it;
`getrusage(RUSAGE_CHILDREN).ru_maxrss` in the wrapper is then the largest peak of any one
process of the stage's tree (every descendant that was waited for; exact, not sampled: this is
the figure a worker pool grows if one process accumulates state), and the wrapper also samples
the whole tree's summed RSS with psutil every 0.25 s (what the machine must hold; shared pages
of forked workers count once per process).

The contender is the hanlm the script lives in (or `--hanlm-path`), with `data_engine.workers`
set to each of `--workers`; `--against datatrove` (the default) also runs datatrove's own
four-stage MinHash pipeline (`benchmarks/datatrove_minhash.py`: its defaults, Korean split into
words by the tokenizer datatrove assigns Korean, one process) on `--against-mb` of the same files,
and hanlm with one worker on the same files: CPU-seconds per MB of each, the ratio, and each one's
recall per planted kind and false positives. Targets: >= 5 MB/s per worker, >= 1.8x from 1 to 2
workers, peak RSS grows <= 10% from half to full input, near-duplicate recall >= 0.95 (exact
too), false positives <= 0.5%; against datatrove, >= 10x its CPU-seconds per MB with a recall
not lower on any kind.

    python benchmarks/corpus.py [--mb 200] [--workers 1,2] [--against datatrove|none]
        [--against-mb 64] [--hanlm-path PATH] [--cache DIR] [--json OUT]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import csv
import json
import os
import random
import re
import shutil
import statistics
import string
import subprocess
import tempfile
import time
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
KINDS = ("exact", "punctuation", "spacing", "appended", "sentence", "reordered")  # planted copies
NEAR = KINDS[1:]
KIND_NAMES = {
    "exact": "exact copy",
    "punctuation": "punctuation changed",
    "spacing": "spacing changed",
    "appended": "one sentence appended",
    "sentence": "one sentence changed",
    "reordered": "paragraphs reordered",
}
DATA_VERSION = 4  # bump when the generator changes: the cache key
_PUNCTUATION = re.compile(r"[.,!?;:'\"()\[\]·…~\-]")

# ---------------------------------------------------------------------------------------------
# The corpus


def sentence_pool(data: Path) -> list[str]:
    """Distinct Korean sentences (>= 12 characters, >= 40% Hangul) from the shared data sets."""
    csv.field_size_limit(1 << 30)

    def tsv(path: Path):
        with open(path, encoding="utf-8", newline="") as f:
            yield from csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)

    korquad = json.loads((data / "korquad" / "KorQuAD_v1.0_dev.json").read_text("utf-8"))
    texts = [p["context"] for a in korquad["data"] for p in a["paragraphs"]]
    kobest = data / "kobest"
    for split in ("train", "dev"):
        texts += [r["Text"] for r in tsv(kobest / "BoolQ" / f"{split}.tsv")]
        for r in tsv(kobest / "HellaSwag" / f"{split}.tsv"):
            texts += [r["context"]] + [r[f"choice{i}"] for i in range(1, 5)]
        for r in tsv(kobest / "COPA" / f"{split}.tsv"):
            texts += [r["sentence"], r["1"], r["2"]]
        for r in tsv(kobest / "WiC" / f"{split}.tsv"):
            texts += [r[k].replace("[", "").replace("]", "") for k in ("SENTENCE1", "SENTENCE2")]
        texts += [r["Text"] for r in tsv(kobest / "SentiNeg" / f"{split}.tsv")]
    with open(data / "gsm8k-ko" / "test_first300.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            texts += [r["kor_question"].split("Answer:")[0], r["kor_answer"]]
    split_re, hangul = re.compile(r"(?<=[.!?])\s+|\n+"), re.compile("[가-힣]")
    seen: dict[str, None] = {}
    for text in texts:
        for s in split_re.split(unicodedata.normalize("NFC", text)):
            s = " ".join(s.split())
            if len(s) >= 12 and len(hangul.findall(s)) >= 0.4 * len(s):
                seen.setdefault(s, None)
    return list(seen)


def _kept(char: str) -> bool:
    return not (
        char.isspace() or char in string.punctuation or unicodedata.category(char)[0] == "P"
    )


def shingles(text: str, n: int = 5) -> set[str]:
    """Character n-grams of the text without whitespace and punctuation, in lower case: how
    hanlm's near-dedup shingles (hanlm.data.minhash.FOLDED)."""
    compact = "".join(c.lower() for c in text if _kept(c))
    return {compact[i : i + n] for i in range(max(1, len(compact) - n + 1))}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def render(paragraphs: list[list[int]], pool: list[str]) -> str:
    return "\n\n".join(" ".join(pool[s] for s in p) for p in paragraphs)


def new_document(rng: random.Random, n_pool: int) -> list[list[int]]:
    """8-16 sentences from anywhere in the pool, in 2-4 paragraphs."""
    sentences = [rng.randrange(n_pool) for _ in range(rng.randint(8, 16))]
    k = rng.randint(2, 4)
    cuts = sorted(rng.sample(range(1, len(sentences)), k - 1))
    return [sentences[a:b] for a, b in zip([0, *cuts], [*cuts, len(sentences)], strict=True)]


def change_sentence(doc, pool, rng) -> list[list[int]] | None:
    """One sentence, anywhere, replaced by another from anywhere in the pool."""
    i = rng.randrange(len(doc))
    j = rng.randrange(len(doc[i]))
    new = rng.randrange(len(pool))
    if new == doc[i][j]:
        return None
    copy = [list(p) for p in doc]
    copy[i][j] = new
    return copy


def append_sentence(doc, pool, rng) -> list[list[int]]:
    """One sentence from anywhere in the pool added at the end."""
    copy = [list(p) for p in doc]
    copy[-1].append(rng.randrange(len(pool)))
    return copy


def reorder_paragraphs(doc, rng) -> list[list[int]] | None:
    """The same paragraphs in another order."""
    order = list(range(len(doc)))
    rng.shuffle(order)
    return None if order == sorted(order) else [list(doc[i]) for i in order]


def change_punctuation(text: str, rng: random.Random) -> str | None:
    """Every punctuation mark dropped, kept or swapped for another, throughout."""
    changed = _PUNCTUATION.sub(lambda m: rng.choice(["", "", m.group(), "!", ",", "…"]), text)
    return changed if changed != text else None


def change_spacing(text: str, rng: random.Random) -> str:
    """Spaces dropped between some words and added inside some words (Korean spacing varies)."""
    out = []
    for para in text.split("\n\n"):
        words = []
        for w in para.split(" "):
            if len(w) >= 3 and rng.random() < 0.08:
                cut = rng.randint(1, len(w) - 1)
                w = w[:cut] + " " + w[cut:]
            words.append(w)
        joined = words[0]
        for w in words[1:]:
            joined += ("" if rng.random() < 0.15 else " ") + w
        out.append(joined)
    changed = "\n\n".join(out)
    return changed if changed != text else text.replace(" ", "", 1)


def build_corpus(data: Path, mb: float, seed: int, files: int, rate: float, out: Path) -> dict:
    """The corpus files and manifest.json in `out` (built only when the manifest is missing)."""
    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        return json.loads(manifest_path.read_text("utf-8"))
    if not (data / "korquad" / "KorQuAD_v1.0_dev.json").is_file() or not (data / "kobest").is_dir():
        sys.exit(
            f"corpus benchmark: the shared Korean data is absent ({data}: needs korquad/, kobest/ "
            "and gsm8k-ko/; see ../shared/data/README.md). Pass --data DIR where it is."
        )
    started = time.perf_counter()
    rng = random.Random(seed)
    pool = sentence_pool(data)

    # The sequence of documents: originals, and planted copies of earlier, unused originals.
    docs: list[tuple[str, str]] = []  # (id, text)
    structure: dict[int, list[list[int]]] = {}  # original index -> paragraphs (for edits)
    unused: list[int] = []  # originals not yet the source of a copy
    planted: dict[str, dict] = {}
    total = 0
    while total < mb * 1e6:
        kind = None
        if len(unused) > 100 and rng.random() < rate * len(KINDS):
            kind = KINDS[rng.randrange(len(KINDS))]
        doc_id = f"doc-{len(docs):07d}"
        text = None
        if kind is not None:
            for _ in range(20):  # an earlier original this kind of edit fits
                k = rng.randrange(len(unused))
                src = unused[k]
                paragraphs = structure[src]
                if kind == "exact":
                    text = docs[src][1]
                elif kind == "punctuation":
                    text = change_punctuation(docs[src][1], rng)
                elif kind == "spacing":
                    text = change_spacing(docs[src][1], rng)
                elif kind == "sentence":
                    edited = change_sentence(paragraphs, pool, rng)
                    text = edited and render(edited, pool)
                elif kind == "reordered":
                    edited = reorder_paragraphs(paragraphs, rng)
                    text = edited and render(edited, pool)
                else:
                    text = render(append_sentence(paragraphs, pool, rng), pool)
                if text:
                    unused[k] = unused[-1]
                    unused.pop()
                    planted[doc_id] = {"kind": kind, "original": docs[src][0]}
                    break
        if not text:
            paragraphs = new_document(rng, len(pool))
            text = render(paragraphs, pool)
            structure[len(docs)] = paragraphs
            unused.append(len(docs))
        docs.append((doc_id, text))
        total += len(text.encode("utf-8"))

    # Files of about equal size, in order: a copy never precedes its original.
    out.mkdir(parents=True, exist_ok=True)
    texts = dict(docs)
    bounds, file_names, size, start = [], [], 0, 0
    for f in range(files):
        name = f"part-{f:02d}.jsonl"
        with open(out / name, "w", encoding="utf-8") as fh:
            end = start
            while end < len(docs) and (size < total * (f + 1) / files or f == files - 1):
                line = json.dumps({"id": docs[end][0], "text": docs[end][1]}, ensure_ascii=False)
                fh.write(line + "\n")
                size += len(docs[end][1].encode("utf-8"))
                end += 1
        file_names.append(name)
        bounds.append([start, end])
        start = end
    generate_s = time.perf_counter() - started

    # How distinct the originals are, and how near the planted copies.
    t0 = time.perf_counter()
    for doc_id, p in planted.items():
        p["jaccard"] = round(jaccard(texts[p["original"]], texts[doc_id]), 4)
    originals = [d for d, _ in docs if d not in planted]
    sample = [tuple(rng.sample(originals, 2)) for _ in range(2000)]
    random_j = sorted(jaccard(texts[a], texts[b]) for a, b in sample)
    shared, worst = most_shared_sentences(structure)
    worst_j = max((jaccard(docs[a][1], docs[b][1]) for a, b in worst), default=0.0)
    measure_s = time.perf_counter() - t0

    manifest = {
        "version": DATA_VERSION,
        "seed": seed,
        "files": file_names,
        "file_bytes": [(out / n).stat().st_size for n in file_names],
        "bounds": bounds,
        "documents": len(docs),
        "originals": len(originals),
        "text_mb": round(total / 1e6, 2),
        "pool_sentences": len(pool),
        "pool_mb": round(sum(len(s.encode("utf-8")) for s in pool) / 1e6, 2),
        "mean_sentence_uses": round(
            sum(sum(map(len, p)) for p in structure.values()) / len(pool), 1
        ),
        "mean_document_chars": round(sum(len(t) for _, t in docs) / len(docs)),
        "random_pairs": len(sample),
        "random_pair_jaccard_max": round(random_j[-1], 4),
        "random_pair_jaccard_mean": round(sum(random_j) / len(random_j), 4),
        "max_shared_sentences": shared,
        "max_shared_sentences_pair_jaccard": round(worst_j, 4),
        "generate_s": round(generate_s, 1),
        "measure_s": round(measure_s, 1),
        "planted": planted,
    }
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, ensure_ascii=False), "utf-8")
    tmp.replace(manifest_path)
    return manifest


def most_shared_sentences(structure: dict[int, list[list[int]]]) -> tuple[int, list[tuple]]:
    """Over every pair of original documents: the most sentences two share, and such pairs."""
    import numpy as np

    doc_of, sent_of = [], []
    for d, paragraphs in structure.items():
        for s in {s for p in paragraphs for s in p}:
            doc_of.append(d)
            sent_of.append(s)
    doc_of, sent_of = np.array(doc_of, dtype=np.int64), np.array(sent_of, dtype=np.int64)
    order = np.argsort(sent_of, kind="stable")
    doc_of, sent_of = doc_of[order], sent_of[order]
    starts = np.flatnonzero(np.r_[True, sent_of[1:] != sent_of[:-1]])
    ends = np.r_[starts[1:], len(sent_of)]
    n = int(doc_of.max()) + 1
    keys = []
    for a, b in zip(starts, ends, strict=True):
        if b - a > 1:
            group = np.sort(doc_of[a:b])
            i, j = np.triu_indices(len(group), 1)
            keys.append(group[i] * n + group[j])
    if not keys:
        return 0, []
    pairs, counts = np.unique(np.concatenate(keys), return_counts=True)
    top = int(counts.max())
    worst = [(int(k // n), int(k % n)) for k in pairs[counts == top][:20]]
    return top, worst


# ---------------------------------------------------------------------------------------------
# Running the stage

# A fresh process per measurement: it runs the stage, samples the tree's summed RSS, waits, and
# reports its children's resource usage (so measurements never mix).
WRAPPER = """
import json, resource, subprocess, sys, time
cmd, cwd, env, log = json.loads(sys.argv[1])
try:
    import psutil
except ImportError:
    psutil = None
with open(log, "wb") as out:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    peak = 0
    root = psutil.Process(p.pid) if psutil else None
    while True:
        try:
            p.wait(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            pass
        if root is not None:
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
print(json.dumps({"rc": p.returncode, "wall_s": wall, "maxrss_kb": ru.ru_maxrss,
                  "tree_peak_bytes": peak if psutil else None,
                  "cpu_s": ru.ru_utime + ru.ru_stime}))
"""


def wrapped(cmd: list[str], env: dict, work: Path, what: str) -> dict:
    """`cmd` run by the wrapper (cwd `work`): its wall time, CPU time and memory figures."""
    log = work / "stage.log"
    # cwd is the scratch folder: `python -m` puts the working directory first on sys.path.
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, json.dumps([cmd, str(work), env, str(log)])],
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    if figures["rc"] != 0:
        tail = log.read_text("utf-8", errors="replace")[-3000:]
        sys.exit(f"corpus benchmark: {what} failed (exit {figures['rc']}):\n{tail}")
    return figures


def run_stage(hanlm_path: Path, inputs: list[Path], workers: int, work: Path) -> dict:
    """One `hanlm corpus` run in a fresh run dir: the wrapper's figures and the output ids."""
    from hanlm.data.corpus import iter_corpus

    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    recipe = run / "bench.toml"  # the documented defaults, not the demo recipe's small parts
    recipe.write_text("[corpus]\nnear_dedup = true\n", "utf-8")
    cmd = [sys.executable, "-m", "hanlm", "corpus", "--run", str(run), "--config", str(recipe)]
    cmd += ["--set", "corpus.near_dedup=true", "--force"]
    cmd += ["--set", f"data_engine.workers={workers}"]
    for path in inputs:
        cmd += ["--input", str(path)]
    env = dict(os.environ, PYTHONPATH=str(hanlm_path))
    figures = wrapped(cmd, env, work, "`hanlm corpus`")
    corpus_dir = run / "corpus"
    figures["stats"] = json.loads((corpus_dir / "stats.json").read_text("utf-8"))
    figures["kept"] = {doc["id"] for doc in iter_corpus(corpus_dir)}
    shutil.rmtree(run, ignore_errors=True)
    return figures


def run_datatrove(inputs: list[Path], work: Path, words: str) -> dict:
    """datatrove's MinHash pipeline (benchmarks/datatrove_minhash.py) on `inputs`, words split
    as `words` says."""
    kept = work / "kept.txt"
    script = Path(__file__).resolve().parent / "datatrove_minhash.py"
    cmd = [sys.executable, str(script), "--work", str(work / "dt"), "--kept", str(kept)]
    cmd += ["--words", words]
    figures = wrapped([*cmd, *map(str, inputs)], dict(os.environ), work, "datatrove's MinHash")
    figures["stats"] = {}
    figures["kept"] = set(kept.read_text("utf-8").split())
    return figures


def score(manifest: dict, n_files: int, kept: set[str]) -> dict:
    """Recall per planted kind (pair collapsed to one) and the false-positive rate."""
    end = manifest["bounds"][n_files - 1][1]
    planted = {d: p for d, p in manifest["planted"].items() if int(d[4:]) < end}
    sources = {p["original"]: d for d, p in planted.items()}
    out: dict = {"recall": {}, "pairs": {}, "both_removed": 0}
    for kind in KINDS:
        pairs = [(p["original"], d) for d, p in planted.items() if p["kind"] == kind]
        collapsed = sum(not (a in kept and b in kept) for a, b in pairs)
        out["pairs"][kind] = len(pairs)
        out["recall"][kind] = collapsed / len(pairs) if pairs else None
    near = [(p["original"], d) for d, p in planted.items() if p["kind"] in NEAR]
    out["recall"]["near"] = sum(not (a in kept and b in kept) for a, b in near) / max(len(near), 1)
    out["both_removed"] = sum(a not in kept and b not in kept for d, p in planted.items()
                              for a, b in [(p["original"], d)])  # fmt: skip
    # By true Jaccard: how recall follows the LSH's S-curve.
    bins = {}
    for lo, hi in ((0.0, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01)):
        pairs = [(p["original"], d) for d, p in planted.items()
                 if p["kind"] in ("appended", "sentence") and lo <= p["jaccard"] < hi]  # fmt: skip
        if pairs:
            hit = sum(not (a in kept and b in kept) for a, b in pairs)
            bins[f"{lo:.2f}-{min(hi, 1):.2f}"] = [hit, len(pairs)]
    out["recall_by_jaccard"] = bins
    originals = [f"doc-{i:07d}" for i in range(end) if f"doc-{i:07d}" not in planted]
    removed = [d for d in originals if d not in kept and not (d in sources and sources[d] in kept)]
    out["originals"] = len(originals)
    out["false_positives"] = len(removed)
    out["fpr"] = len(removed) / len(originals)
    return out


# ---------------------------------------------------------------------------------------------


def files_for(manifest: dict, mb: float) -> int:
    """How many of the corpus files make about `mb` MB (at least one)."""
    sizes = manifest["file_bytes"]
    per = sum(sizes) / len(sizes)
    return max(1, min(len(sizes), round(mb * 1e6 / per)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="MB of input (RSS also at half)")
    parser.add_argument("--workers", default="1,2", help="data_engine.workers values to measure")
    parser.add_argument("--against", choices=("datatrove", "none"), default="datatrove",
                        help="the peer run on the same files: datatrove's MinHash pipeline")  # fmt: skip
    parser.add_argument("--datatrove-words", default="kiwi,whitespace,split",
                        help="how datatrove splits words: kiwi (its Korean default), "
                        "whitespace (spaCy), split (str.split)")  # fmt: skip
    parser.add_argument("--against-mb", type=float, default=64.0,
                        help="MB the peer and hanlm with one worker run on side by side")  # fmt: skip
    parser.add_argument("--hanlm-path", type=Path, default=ROOT,
                        help="folder holding the hanlm package to benchmark")  # fmt: skip
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache" / "hanlm-bench" / "corpus"
    )
    parser.add_argument("--data", type=Path, default=SHARED, help="the shared Korean data sets")
    parser.add_argument("--files", type=int, default=8, help="input files the corpus is cut into")
    parser.add_argument("--planted", type=float, default=0.03,
                        help="fraction of documents planted per kind")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per hanlm configuration")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    hanlm_path = args.hanlm_path.resolve()
    if not (hanlm_path / "hanlm" / "__init__.py").is_file():
        sys.exit(f"corpus benchmark: no hanlm package in {hanlm_path}")
    args.cache.mkdir(parents=True, exist_ok=True)

    key = f"v{DATA_VERSION}-{args.mb:g}mb-{args.files}files-p{args.planted:g}-seed{args.seed}"
    data_dir = args.cache / key
    cached = (data_dir / "manifest.json").is_file()
    manifest = build_corpus(
        args.data, args.mb, args.seed, args.files, args.planted, args.cache / key
    )
    print(
        f"corpus: {data_dir} ({'cached' if cached else 'built'}; generated in "
        f"{manifest['generate_s']} s, measured in {manifest['measure_s']} s): "
        f"{sum(manifest['file_bytes']) / 1e6:.1f} MB in {len(manifest['files'])} files, "
        f"{manifest['documents']:,} documents ({manifest['originals']:,} originals), "
        f"{manifest['mean_document_chars']} characters on average"
    )
    print(
        f"sentence pool: {manifest['pool_sentences']:,} distinct sentences "
        f"({manifest['pool_mb']} MB) from {args.data}, each used {manifest['mean_sentence_uses']} "
        f"times on average; no two originals share more than {manifest['max_shared_sentences']} "
        f"sentences (the most 5-gram Jaccard of up to 20 such pairs: "
        f"{manifest['max_shared_sentences_pair_jaccard']})"
    )
    print(
        f"random pairs of originals ({manifest['random_pairs']:,}): character-5-gram Jaccard "
        f"max {manifest['random_pair_jaccard_max']:.3f}, mean {manifest['random_pair_jaccard_mean']:.4f}"
    )
    print("planted copies (true character-5-gram Jaccard to the original, folded text):")
    for kind in KINDS:
        js = sorted(p["jaccard"] for p in manifest["planted"].values() if p["kind"] == kind)
        below = sum(j < 0.6 for j in js)
        print(
            f"  {KIND_NAMES[kind]:22s}: {len(js):5,} ({len(js) / manifest['documents']:.1%})  "
            f"min {js[0]:.3f}  p10 {js[len(js) // 10]:.3f}  median {js[len(js) // 2]:.3f}  "
            f"mean {sum(js) / len(js):.3f}  below 0.6: {below}"
        )

    paths = [data_dir / name for name in manifest["files"]]
    total_files = len(paths)
    plan = []  # (implementation, workers, number of files)
    for w in workers:
        for n in sorted({files_for(manifest, args.mb / 2), total_files}):
            plan.append(("hanlm", w, n))
    if args.against == "datatrove":
        side = files_for(manifest, args.against_mb)  # side by side: the same files
        if ("hanlm", 1, side) not in plan:
            plan.append(("hanlm", 1, side))
        plan += [(f"datatrove {words}", 1, side) for words in args.datatrove_words.split(",")]

    rows = []
    for name, w, n in plan:
        mb = sum(manifest["file_bytes"][:n]) / 1e6
        load = os.getloadavg()[0]
        # the median of --repeats runs: on a shared 2-core machine one run's wall time moves by
        # a few tenths of a second with what else is running
        figs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(dir=args.cache) as work:
                if name == "hanlm":
                    figs.append(run_stage(hanlm_path, paths[:n], w, Path(work)))
                else:
                    figs.append(run_datatrove(paths[:n], Path(work), name.split()[1]))
        fig = figs[0]
        fig["wall_s"] = statistics.median(f["wall_s"] for f in figs)
        fig["cpu_s"] = statistics.median(f["cpu_s"] for f in figs)
        fig["maxrss_kb"] = max(f["maxrss_kb"] for f in figs)
        fig["walls"] = [round(f["wall_s"], 2) for f in figs]
        sc = score(manifest, n, fig.pop("kept"))
        row = {
            "implementation": name,
            "workers": w,
            "files": n,
            "input_mb": round(mb, 1),
            "wall_s": round(fig["wall_s"], 2),
            "walls": fig["walls"],
            "cpu_s": round(fig["cpu_s"], 1),
            "mb_s": mb / fig["wall_s"],
            "mb_s_per_worker": mb / fig["wall_s"] / w,
            "peak_rss_mb": fig["maxrss_kb"] / 1024,
            "tree_rss_mb": fig["tree_peak_bytes"] / 2**20 if fig["tree_peak_bytes"] else None,
            "load_before": round(load, 2),
            "stats": {
                k: fig["stats"].get(k)
                for k in (
                    "documents_in",
                    "documents_out",
                    "too_short",
                    "exact_duplicates",
                    "near_duplicates",
                )
            },
            **sc,
        }
        rows.append(row)
        print(
            f"ran {name}, {row['workers']} worker(s), {mb:.1f} MB: {row['wall_s']} s (median of {row['walls']}), "
            f"load before {load:.2f}, stats {row['stats']}",
            flush=True,
        )

    print()
    print("| implementation | workers | input MB | wall s | CPU s | MB/s | MB/s per worker | peak RSS MB "
          "(largest process) | tree RSS MB (sum, sampled) | exact recall | near recall: "
          + " / ".join(k for k in NEAR) + " (all) | false positives |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rec = r["recall"]
        tree = f"{r['tree_rss_mb']:.0f}" if r["tree_rss_mb"] else "-"
        print(
            f"| {r['implementation']} | {r['workers']} | {r['input_mb']:.1f} | {r['wall_s']:.1f} | "
            f"{r['cpu_s']:.1f} | {r['mb_s']:.2f} | {r['mb_s_per_worker']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {tree} | {rec['exact']:.3f} | "
            + " / ".join(f"{rec[k]:.3f}" for k in NEAR)
            + f" ({rec['near']:.3f}) | "
            f"{r['false_positives']}/{r['originals']} = {r['fpr']:.2%} |"
        )
    print()
    print("near recall by true Jaccard (one sentence appended and changed together):")
    for r in rows:
        bins = ", ".join(f"{b}: {h}/{n}" for b, (h, n) in r["recall_by_jaccard"].items())
        print(f"  {r['implementation']}, {r['workers']} worker(s), {r['input_mb']:.0f} MB: {bins}; "
              f"pairs with both removed: {r['both_removed']}")  # fmt: skip

    # Targets
    half_files = files_for(manifest, args.mb / 2)

    def row_of(implementation: str, w: int, full: bool):
        n = total_files if full else half_files
        return next(r for r in rows if r["implementation"] == implementation
                    and r["workers"] == w and r["files"] == n)  # fmt: skip

    checks = []

    def check(label: str, ok: bool, detail: str) -> None:
        checks.append({"target": label, "pass": ok, "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}  {label}: {detail}")

    print()
    print("targets (hanlm at the full size):")
    for w in workers:
        r = row_of("hanlm", w, True)
        check(f"MB/s per worker >= 5 ({w} worker(s))", r["mb_s_per_worker"] >= 5,
              f"{r['mb_s_per_worker']:.2f}")  # fmt: skip
    if 1 in workers and 2 in workers:
        s = row_of("hanlm", 2, True)["mb_s"] / row_of("hanlm", 1, True)["mb_s"]
        check("speed-up 1 -> 2 workers >= 1.8x", s >= 1.8, f"{s:.2f}x")
    for w in workers:
        half, full = row_of("hanlm", w, False), row_of("hanlm", w, True)
        g = full["peak_rss_mb"] / half["peak_rss_mb"] - 1
        detail = (f"{half['peak_rss_mb']:.0f} MB at {half['input_mb']:.0f} MB -> "
                  f"{full['peak_rss_mb']:.0f} MB at {full['input_mb']:.0f} MB, {g:+.1%}")  # fmt: skip
        if half["tree_rss_mb"] and full["tree_rss_mb"]:
            gt = full["tree_rss_mb"] / half["tree_rss_mb"] - 1
            detail += (f" (tree sum {half['tree_rss_mb']:.0f} -> {full['tree_rss_mb']:.0f} MB, "
                       f"{gt:+.1%})")  # fmt: skip
        check(f"peak RSS growth half -> full input <= 10% ({w} worker(s))", g <= 0.10, detail)
    for w in workers:
        r = row_of("hanlm", w, True)
        rec = r["recall"]
        worst = min(rec[k] for k in NEAR)
        check(f"near-duplicate recall >= 0.95, every kind ({w} worker(s))", worst >= 0.95,
              ", ".join(f"{KIND_NAMES[k]} {rec[k]:.3f}" for k in NEAR) + f"; all {rec['near']:.3f}")  # fmt: skip
        check(f"exact-duplicate recall >= 0.95 ({w} worker(s))", rec["exact"] >= 0.95,
              f"{rec['exact']:.3f}")  # fmt: skip
        check(f"false-positive rate <= 0.5% ({w} worker(s))", r["fpr"] <= 0.005, f"{r['fpr']:.3%}")

    ratios = {}
    peers = [r for r in rows if r["implementation"].startswith("datatrove")]
    if peers:
        ours = next(r for r in rows if r["implementation"] == "hanlm" and r["workers"] == 1
                    and r["files"] == peers[0]["files"])  # fmt: skip
        print()
        print(f"side by side on the same {ours['input_mb']:.1f} MB, one process each, CPU-seconds "
              f"(per MB): hanlm {ours['cpu_s']:.1f} ({ours['cpu_s'] / ours['input_mb']:.3f})")  # fmt: skip
        for peer in peers:
            ratio = peer["cpu_s"] / ours["cpu_s"]
            ratios[f"{peer['implementation'].replace(' ', '_')}_cpu_s_over_hanlm"] = ratio
            print(f"  {peer['implementation']}'s MinHash: {peer['cpu_s']:.1f} "
                  f"({peer['cpu_s'] / peer['input_mb']:.3f}), {ratio:.1f}x hanlm's; false "
                  f"positives {peer['false_positives']}/{peer['originals']} (hanlm "
                  f"{ours['false_positives']})")  # fmt: skip
        # datatrove's own default for Korean first, then the cheapest split of those run
        default = next((r for r in peers if r["implementation"] == "datatrove kiwi"), None)
        cheapest = min(peers, key=lambda r: r["cpu_s"])
        for peer in dict.fromkeys(p for p in (default, cheapest) if p is not None):
            ratio = peer["cpu_s"] / ours["cpu_s"]
            what = "its default for Korean" if peer is default else "the cheapest split run"
            check(f"CPU-seconds per MB, {peer['implementation']} ({what}) / hanlm >= 10x",
                  ratio >= 10, f"{ratio:.1f}x")  # fmt: skip
        for peer in peers:
            lower = [k for k in KINDS if ours["recall"][k] < peer["recall"][k]]
            check(f"recall not lower than {peer['implementation']}'s on any planted kind",
                  not lower, ", ".join(f"{k} {ours['recall'][k]:.3f} vs "
                                       f"{peer['recall'][k]:.3f}" for k in KINDS))  # fmt: skip
    print(f"({os.cpu_count()} CPU cores, python {sys.version.split()[0]}, hanlm from {hanlm_path})")

    if args.json:
        keep = {k: v for k, v in manifest.items() if k != "planted"}
        args.json.write_text(json.dumps({"corpus": keep, "rows": rows, "targets": checks,
                                         "ratios": ratios}, indent=1), "utf-8")  # fmt: skip


if __name__ == "__main__":
    main()
