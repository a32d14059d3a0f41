"""Held-out compression of hanlm's tokenizer with its new pre-tokenizer against the old one.

Old (before issue 19): digits split one by one, then GPT-2's byte-level regex (llama.cpp's
`smollm` type). New: Qwen2's split (llama.cpp's `qwen2` type): a letter run keeps one leading
space or punctuation mark, digits one by one, newlines grouped. Both are trained by the same
code (hanlm.data.tokenizer.train: the same trainer, special tokens and padding) on the same
Korean documents at the same vocabulary size, and measured on the same held-out documents:
characters and UTF-8 bytes per token (higher is better) and the ratio new / old.

Text: the real Korean in ../shared/data (KorQuAD 1.0 dev contexts, KoBEST BoolQ paragraphs,
COPA, HellaSwag and SentiNeg sentences, GSM8K-ko problems and solutions), documents shuffled
with a fixed seed, 10% held out. The script says so and exits when the data is absent.

    python benchmarks/tokenizer_pretok.py [--vocab 4096 8192 16384] [--heldout 0.1]
"""

from __future__ import annotations

import sys

# the script's folder holds `tokenize.py`, which would shadow the standard library's module
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import csv
import json
import random
import unicodedata
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def korean_documents() -> list[str]:
    """Every Korean text of the shared data sets, NFC as the corpus stage writes it, deduplicated."""
    docs: list[str] = []
    korquad = SHARED / "korquad" / "KorQuAD_v1.0_dev.json"
    if korquad.is_file():
        data = json.loads(korquad.read_text(encoding="utf-8"))
        docs += [p["context"] for a in data["data"] for p in a["paragraphs"]]
    columns = {
        "BoolQ": ["Text"],
        "COPA": ["sentence", "1", "2"],
        "HellaSwag": ["context", "choice1", "choice2", "choice3", "choice4"],
        "SentiNeg": ["Text"],
    }
    for task, names in columns.items():
        for split in ("train", "dev"):
            path = SHARED / "kobest" / task / f"{split}.tsv"
            if path.is_file():
                with open(path, encoding="utf-8", newline="") as f:
                    for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                        docs.append(" ".join(row[n] for n in names if row.get(n)))
    gsm = SHARED / "gsm8k-ko" / "test_first300.jsonl"
    if gsm.is_file():
        for line in gsm.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            docs.append(f"{row['kor_question']}\n\n{row['kor_answer']}")
    seen, unique = set(), []
    for doc in (unicodedata.normalize("NFC", d).strip() for d in docs):
        if doc and doc not in seen:
            seen.add(doc)
            unique.append(doc)
    return unique


def old_untrained():
    """hanlm's tokenizer pipeline before issue 19: digits, then GPT-2's byte-level regex."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--heldout", type=float, default=0.1, help="share of documents held out")
    parser.add_argument("--min-frequency", type=int, default=2)
    args = parser.parse_args()

    docs = korean_documents()
    if not docs:
        print(f"skipped: no Korean data in {SHARED} (KorQuAD, KoBEST, GSM8K-ko)")
        return
    from hanlm.data import tokenizer

    random.Random(0).shuffle(docs)
    cut = max(1, int(len(docs) * args.heldout))
    heldout, train = docs[:cut], docs[cut:]
    chars = sum(len(d) for d in docs)
    print(
        f"{len(docs):,} Korean documents ({chars / 1e6:.2f} M characters): "
        f"{len(train):,} to train, {len(heldout):,} held out"
    )
    print(f"{'vocab':>6}  {'pre-tokenizer':<20} {'chars/token':>11} {'bytes/token':>11}")
    rows = []
    for vocab in args.vocab:
        figures = {}
        for name, build in (("old (smollm)", old_untrained), ("new (qwen2)", None)):
            if build is None:
                tok = tokenizer.train(train, vocab, args.min_frequency, 32)
            else:  # the same training code, with the old pipeline
                with mock.patch.object(tokenizer, "build_untrained", build):
                    tok = tokenizer.train(train, vocab, args.min_frequency, 32)
            figures[name] = tokenizer.compression(tok, heldout)
            f = figures[name]
            print(
                f"{vocab:>6}  {name:<20} {f['chars_per_token']:>11.4f} {f['bytes_per_token']:>11.4f}"
            )
        old, new = figures["old (smollm)"], figures["new (qwen2)"]
        ratio = new["chars_per_token"] / old["chars_per_token"]
        print(f"{vocab:>6}  {'new / old':<20} {ratio:>11.4f} {ratio:>11.4f}")
        rows.append({"vocab": vocab, "old": old, "new": new, "ratio": round(ratio, 4)})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
