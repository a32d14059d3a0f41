"""What a mixture of corpus sources costs: `hanlm shards` on three weighted sources against the
same documents as one pile, and the mix's plan and order against the one pile's permutation.

The same Korean documents (KorQuAD paragraphs, sentence-shuffled; the demo world without the
shared data) are cut into three source files of 70%, 25% and 5%. Run A reads them as one pile
(`corpus.inputs`), run B as `[[corpus.sources]]` with weights 0.6 / 0.3 / 0.1. Both go through
the corpus and tokenizer stages once; then, interleaved and best of N, the shards stage (2
workers) of each, and the loader's first epoch order: for A a permutation of its windows, for B
the mixture's plan on the shards plus its order (hanlm.data.mixture), for a budget of one pass
over the tokens. Target: B's shards plus its mix within 5% of A's shards.

    python benchmarks/mixture.py [--mb 200] [--repeats 2]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARES = {"big": 0.70, "mid": 0.25, "small": 0.05}  # of the documents, by bytes
WEIGHTS = {"big": 0.6, "mid": 0.3, "small": 0.1}  # of the training tokens


def _documents(mb: float) -> list[str]:
    """benchmarks/tokenize.py's Korean documents (its file name shadows the standard library's
    `tokenize`, so it is loaded by path)."""
    spec = importlib.util.spec_from_file_location(
        "bench_tokenize", ROOT / "benchmarks" / "tokenize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.korean_documents("korquad", mb)


def _write_sources(docs: list[str], folder: Path) -> dict[str, Path]:
    total = sum(len(d.encode("utf-8")) for d in docs)
    paths, start = {}, 0
    for name, share in SHARES.items():
        paths[name] = folder / f"{name}.jsonl"
        with open(paths[name], "w", encoding="utf-8") as f:
            size = 0
            while start < len(docs) and (size < share * total or name == "small"):
                f.write(json.dumps({"text": docs[start]}, ensure_ascii=False) + "\n")
                size += len(docs[start].encode("utf-8"))
                start += 1
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="MB of UTF-8 text")
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each contender")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()

    from hanlm.config import load_config
    from hanlm.data import mixture
    from hanlm.data.loader import TokenLoader
    from hanlm.pipeline import run_stage

    docs = _documents(args.mb)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = _write_sources(docs, tmp)
        common = {
            "corpus.near_dedup": False,
            "corpus.part_chars": 16_000_000,
            "tokenizer.vocab_size": args.vocab,
            "tokenizer.sample_chars": 4_000_000,
            "shards.val_fraction": 0.0,
            "data_engine.workers": 2,
            "pretrain.seq_len": args.seq_len,
            "pretrain.micro_batch": 1,
            "pretrain.global_batch_tokens": args.seq_len * 8,
        }
        pile = tmp / "pile.toml"
        pile.write_text(f"[corpus]\ninputs = {json.dumps([str(p) for p in paths.values()])}\n")
        mixed = tmp / "mixed.toml"
        mixed.write_text(
            "".join(
                f'[[corpus.sources]]\nname = "{name}"\ninputs = ["{path}"]\n'
                f"weight = {WEIGHTS[name]}\nmax_epochs = 100\n"
                for name, path in paths.items()
            )
        )
        runs = {"one pile": (pile, tmp / "a"), "three sources": (mixed, tmp / "b")}
        configs = {}
        for name, (recipe, run) in runs.items():
            cfg = load_config(recipe, values=common)
            run_stage("corpus", cfg, run)
            run_stage("tokenizer", cfg, run)
            manifest = run_stage("shards", cfg, run)
            tokens = manifest.splits["train"].tokens
            configs[name] = load_config(recipe, values={**common, "pretrain.max_tokens": tokens})
        text_mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6

        def shards(name: str) -> None:
            run_stage("shards", configs[name], runs[name][1], force=True)

        def order(name: str) -> int:
            cfg, run = configs[name], runs[name][1]
            mix = mixture.for_training(cfg, run / "shards")
            loader = TokenLoader.from_shards(
                run / "shards", "train", seq_len=args.seq_len, micro_batch=1, mixture=mix
            )
            return len(loader._epoch_order(0))

        best = {(k, n): float("inf") for k in ("shards", "order") for n in runs}
        load_before = os.getloadavg()
        for _ in range(args.repeats):  # interleaved: a busy neighbour slows both alike
            for kind, name in best:
                started = time.perf_counter()
                windows = shards(name) if kind == "shards" else order(name)
                best[kind, name] = min(best[kind, name], time.perf_counter() - started)
                if kind == "order":
                    print(f"{name}: {windows:,} windows in the first epoch's order")
        load_after = os.getloadavg()

    a_shards, b_shards = best["shards", "one pile"], best["shards", "three sources"]
    a_order, b_order = best["order", "one pile"], best["order", "three sources"]
    print(
        f"text: {text_mb:.1f} MB of Korean in three sources ({', '.join(f'{k} {v:.0%}' for k, v in SHARES.items())}), "
        f"weights {', '.join(f'{k} {v:g}' for k, v in WEIGHTS.items())}; vocab {args.vocab}, seq_len {args.seq_len}, "
        f"{os.cpu_count()} CPU cores, python {sys.version.split()[0]}"
    )
    print(f"shards, one pile         : {a_shards:7.2f} s ({text_mb / a_shards:.2f} MB/s)")
    print(f"shards, three sources    : {b_shards:7.2f} s ({text_mb / b_shards:.2f} MB/s)")
    print(f"order, one pile          : {a_order:7.3f} s (a permutation of the windows)")
    print(f"plan + order, mixture    : {b_order:7.3f} s")
    print(
        f"ratio (shards + order), sources / one pile = "
        f"{(b_shards + b_order) / (a_shards + a_order):.3f}  (target <= 1.05)"
    )
    loads = [" ".join(f"{x:.2f}" for x in load) for load in (load_before, load_after)]
    print(f"load average (1/5/15 min): {loads[0]} before, {loads[1]} after")


if __name__ == "__main__":
    main()
