"""Text MB/s of `hanlm shards` with 1 and 2 workers against raw `tokenizers` encode_batch_fast.

Same Korean text, same trained tokenizer, one process run. `hanlm shards` is timed end to end
as the stage runs it (the shards stage: the data engine's tasks, one per corpus part, then the gather
and manifest; not the interpreter's start). The baseline is the floor a hand-written loop would
get: single-threaded `encode_batch_fast` over in-memory strings, with no reading, splitting or
writing. Targets: shards(1 worker) >= 0.9x raw, and 2 workers >= 1.8x 1. The machine's load
average is printed next to the figures: other processes on it slow the 2-worker run first.

    python benchmarks/tokenize.py [--mb 24] [--vocab 32768] [--source korquad|demo]
"""

from __future__ import annotations

import sys

# This file's name shadows the standard library's `tokenize` (which transformers needs): keep
# the script's own folder off the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KORQUAD = ROOT.parent / "shared" / "data" / "korquad" / "KorQuAD_v1.0_dev.json"


def korean_documents(source: str, megabytes: float, seed: int = 0) -> list[str]:
    """Real KorQuAD paragraphs, sentence-shuffled into distinct documents, or the demo world."""
    if source == "korquad" and KORQUAD.is_file():
        data = json.loads(KORQUAD.read_text(encoding="utf-8"))
        paragraphs = [p["context"] for a in data["data"] for p in a["paragraphs"]]
        rng = random.Random(seed)
        docs, size = [], 0
        while size < megabytes * 1e6:
            sentences = rng.choice(paragraphs).split(". ")
            rng.shuffle(sentences)
            doc = ". ".join(sentences)
            docs.append(doc)
            size += len(doc.encode("utf-8"))
        return docs
    from hanlm import demo

    return [d["text"] for d in demo.build(seed=seed, size_mb=megabytes).documents]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=24.0, help="MB of UTF-8 text")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--source", choices=["korquad", "demo"], default="korquad")
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each contender")
    parser.add_argument(
        "--part-chars", type=int, default=1_000_000, help="corpus part size: one shards task each"
    )
    args = parser.parse_args()

    from hanlm.config import load_config
    from hanlm.data import corpus
    from hanlm.pipeline import run_stage
    from hanlm.stages import run_facts

    docs = korean_documents(args.source, args.mb)
    text_mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "input.jsonl"
        with open(src, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        run = tmp / "run"
        values = {
            "corpus.inputs": [str(src)],
            "corpus.near_dedup": False,
            "corpus.part_chars": args.part_chars,
            "tokenizer.vocab_size": args.vocab,
            "tokenizer.sample_chars": 4_000_000,
            "shards.val_fraction": 0.0,
        }
        cfg = load_config("demo", values=values)
        run_stage("corpus", cfg, run)
        run_stage("tokenizer", cfg, run)
        texts = [d["text"] for d in corpus.iter_corpus(run / "corpus")]
        text_mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
        part_mb = [
            sum(len(d["text"].encode("utf-8")) for d in corpus.iter_part(p)) / 1e6
            for p in corpus.corpus_parts(run / "corpus")
        ]

        # Raw floor: one thread, like one shard worker.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        tok = run_facts.tokenizer(run)

        def raw_encode() -> int:
            n = 0
            for i in range(0, len(texts), cfg.shards.batch_docs):
                n += sum(
                    len(e.ids) for e in tok.encode_batch_fast(texts[i : i + cfg.shards.batch_docs])
                )
            return n

        def hanlm_shards(workers: int):  # the ShardsManifest
            return run_stage(
                "shards",
                load_config("demo", values={**values, "data_engine.workers": workers}),
                run,
                force=True,
            )

        # Interleaved repeats, best of each: a busy neighbour on the machine hurts all alike.
        best = {"raw": float("inf"), 1: float("inf"), 2: float("inf")}
        load_before = os.getloadavg()
        for _ in range(args.repeats):
            for name in best:
                t0 = time.perf_counter()
                if name == "raw":
                    n_tokens = raw_encode()
                else:
                    m = hanlm_shards(name)
                    assert m.splits["train"].tokens == n_tokens + m.splits["train"].documents
                best[name] = min(best[name], time.perf_counter() - t0)
        raw_s, timings = best["raw"], best

    raw = text_mb / raw_s
    one, two = text_mb / timings[1], text_mb / timings[2]
    print(
        f"text: {text_mb:.1f} MB of Korean ({args.source}), {len(texts):,} documents, "
        f"vocab {args.vocab}, {os.cpu_count()} CPU cores, python {sys.version.split()[0]}"
    )
    print(f"raw tokenizers encode_batch_fast, 1 thread : {raw:6.2f} MB/s")
    print(f"hanlm shards, 1 worker                    : {one:6.2f} MB/s")
    print(f"hanlm shards, 2 workers                   : {two:6.2f} MB/s")
    print(f"ratio shards(1 worker) / raw       = {one / raw:.3f}  (target >= 0.90)")
    print(f"ratio shards(2 workers) / (1)      = {two / one:.3f}  (target >= 1.80)")
    print(
        f"corpus parts (one task each): {len(part_mb)}, "
        f"MB each: {', '.join(f'{mb:.2f}' for mb in part_mb)}"
    )
    load_after = os.getloadavg()
    print(
        "load average (1/5/15 min) before: "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after: "
        f"{' '.join(f'{x:.2f}' for x in load_after)}"
    )


if __name__ == "__main__":
    main()
