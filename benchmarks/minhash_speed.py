"""MinHash signature speed: hanlm.data.minhash.signatures against datasketch per document.

Text: about 20 MB (UTF-8) of Korean: KorQuAD 1.0 dev paragraphs from `../shared/data`,
sentence-shuffled into distinct documents; random Hangul syllables with spaces when that is
absent. hanlm: `signatures(batch, num_perm=128, ngram=5, seed=0)` over batches of about 2 MB.
Baseline: datasketch as hanlm's corpus stage used it (whitespace-free 5-gram shingle set,
`MinHash(num_perm=128, seed=0).update_batch(...)` per document) over a subsample. One process,
one thread: the figures are MB/s per core. Target: hanlm >= 25 MB/s.

    python benchmarks/minhash_speed.py [--mb 20] [--batch-mb 2] [--repeats 3] [--baseline-mb 1]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import random
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))

from hanlm.data.minhash import signatures


def korean_texts(mb: float, rng: random.Random) -> tuple[list[str], str]:
    path = SHARED / "korquad" / "KorQuAD_v1.0_dev.json"
    texts, size = [], 0
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        paragraphs = [p["context"] for a in data["data"] for p in a["paragraphs"]]
        while size < mb * 1e6:
            sentences = rng.choice(paragraphs).split(". ")
            rng.shuffle(sentences)
            texts.append(". ".join(sentences))
            size += len(texts[-1].encode())
        return texts, "KorQuAD 1.0 dev paragraphs, sentence-shuffled"
    syllables = [chr(c) for c in range(0xAC00, 0xD7A4)]
    while size < mb * 1e6:
        words = [
            "".join(rng.choices(syllables, k=rng.randint(1, 4)))
            for _ in range(rng.randint(20, 300))
        ]
        texts.append(" ".join(words))
        size += len(texts[-1].encode())
    return texts, "random Hangul syllables with spaces"


def batches(texts: list[str], batch_mb: float) -> list[list[str]]:
    out, current, size = [], [], 0
    for text in texts:
        current.append(text)
        size += len(text.encode())
        if size >= batch_mb * 1e6:
            out.append(current)
            current, size = [], 0
    return [*out, current] if current else out


def datasketch_signatures(texts: list[str], num_perm: int, ngram: int, seed: int) -> None:
    from datasketch import MinHash

    for text in texts:
        compact = "".join(text.split())
        shingles = {compact[i : i + ngram] for i in range(max(1, len(compact) - ngram + 1))}
        m = MinHash(num_perm=num_perm, seed=seed)
        m.update_batch([s.encode("utf-8") for s in shingles])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--batch-mb", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-mb", type=float, default=1.0)
    args = parser.parse_args()

    rng = random.Random(0)
    texts, source = korean_texts(args.mb, rng)
    size = sum(len(t.encode()) for t in texts)
    groups = batches(texts, args.batch_mb)
    chars = sum(map(len, texts)) / len(texts)
    print(f"text: {source}: {len(texts):,} documents, {size / 1e6:.1f} MB, {chars:.0f} chars each")
    print(f"batches: {len(groups)} of ~{args.batch_mb:g} MB; num_perm=128, ngram=5, seed=0")

    signatures(groups[0][:10], num_perm=128, ngram=5, seed=0)  # warm up the parameter cache
    best = 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        for group in groups:
            signatures(group, num_perm=128, ngram=5, seed=0)
        best = max(best, size / 1e6 / (time.perf_counter() - start))
    print(f"hanlm signatures:  {best:8.2f} MB/s per core (best of {args.repeats})")

    sample = rng.sample(texts, len(texts))
    picked, picked_size = [], 0
    for text in sample:
        if picked_size >= args.baseline_mb * 1e6:
            break
        picked.append(text)
        picked_size += len(text.encode())
    start = time.perf_counter()
    datasketch_signatures(picked, 128, 5, 0)
    baseline = picked_size / 1e6 / (time.perf_counter() - start)
    print(
        f"datasketch:        {baseline:8.2f} MB/s per core ({picked_size / 1e6:.1f} MB subsample)"
    )
    print(f"ratio:             {best / baseline:8.1f}x")


if __name__ == "__main__":
    main()
