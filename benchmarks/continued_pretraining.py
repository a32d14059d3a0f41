"""Continued pretraining against training from scratch, at the same tokens, on real Korean text.

A "foreign" base model is made first, as a practitioner would find one: hanlm pretrains the
`demo` preset with a tokenizer of its own on KoBEST's texts (BoolQ's Wikipedia paragraphs,
SentiNeg's reviews, HellaSwag's and COPA's sentences) and exports it as a plain Hugging Face
folder. Then, on KorQuAD 1.0's Wikipedia paragraphs (text the base never saw), the same number of
tokens trains:

- `scratch`: hanlm's recipe from scratch: a tokenizer trained on KorQuAD, the same preset;
- `continued`: `model.init_from` the base, its tokenizer kept;
- `extended-pieces` / `extended-mean`: the base with `tokenizer.extend` new tokens trained on
  KorQuAD, their rows from their old pieces' rows or from the mean row.

Each run's held-out KorQuAD bits per byte (the Trainer's validation: the same bytes whatever
the tokenizer) are printed, with the held-out characters per token of the extended tokenizer
before and after. Short horizons on a 2-core CPU: a 4M-parameter model and well under a million
tokens, far from what a real base model brings; read the ordering, not the size of the gaps.

    python benchmarks/continued_pretraining.py             # ~6 min on 2 cores
    python benchmarks/continued_pretraining.py --smoke     # seconds: the tests run it
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
KOBEST_TEXT = {  # task -> the columns that hold running text
    "BoolQ": ("Text",),
    "SentiNeg": ("Text",),
    "HellaSwag": ("context",),
    "COPA": ("sentence",),
}
COMMON = {
    "decontam.enabled": False,  # the text is the benchmarks': here it is only text to learn
    "corpus.part_chars": 200_000,
    "data_engine.workers": 2,
    "shards.val_fraction": 0.05,
    "tokenizer.vocab_size": 4096,
    "pretrain.seq_len": 128,
    "pretrain.micro_batch": 16,
    "pretrain.global_batch_tokens": 2048,
    "pretrain.document_masking": False,
    "precision.mode": "fp32",
    "optimizer.lr": 3e-3,
    "optimizer.warmup_steps": 10,
    "logging.log_every": 25,
    "logging.eval_batches": 16,
    "checkpoint.every": 0,
    "checkpoint.async_save": False,
    "parallel.device": "cpu",
}


def kobest_texts(data: Path) -> list[str]:
    texts = []
    for task, columns in KOBEST_TEXT.items():
        for split in ("train", "dev"):
            with open(data / "kobest" / task / f"{split}.tsv", encoding="utf-8", newline="") as f:
                for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                    texts += [row[c] for c in columns if row.get(c)]
    return texts


def korquad_texts(data: Path) -> list[str]:
    articles = json.loads((data / "korquad" / "KorQuAD_v1.0_dev.json").read_text("utf-8"))
    return [p["context"] for a in articles["data"] for p in a["paragraphs"]]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"{path.stem}-{i}", "text": text}, ensure_ascii=False) + "\n")
    return path


SMOKE = {"shards.val_fraction": 0.3, "logging.eval_batches": 1}


def train(run_dir: Path, values: dict, stages=("corpus", "tokenizer", "shards", "pretrain")):
    from hanlm.config import load_config
    from hanlm.pipeline import run_stage

    cfg = load_config(values={**COMMON, **values})
    results = {}
    started = time.perf_counter()
    for stage in stages:
        results[stage] = run_stage(stage, cfg, run_dir)
    results["seconds"] = time.perf_counter() - started
    return cfg, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-steps", type=int, default=400)
    parser.add_argument("--steps", type=int, default=150, help="each run on KorQuAD")
    parser.add_argument("--extend", type=int, default=512, help="tokens added (extended runs)")
    parser.add_argument("--data", type=Path, default=SHARED)
    parser.add_argument("--work", type=Path, help="keep the runs here (default: a temp folder)")
    parser.add_argument("--smoke", action="store_true", help="few documents and steps")
    args = parser.parse_args()
    if not (args.data / "korquad").is_dir():
        print(f"no shared Korean data at {args.data}: give --data", file=sys.stderr)
        return 2
    if args.smoke:
        args.base_steps, args.steps, args.extend = 4, 4, 16
        COMMON.update(SMOKE)
    work = args.work or Path(tempfile.mkdtemp(prefix="hanlm-continued-"))
    work.mkdir(parents=True, exist_ok=True)
    base_text, target_text = kobest_texts(args.data), korquad_texts(args.data)
    if args.smoke:
        base_text, target_text = base_text[:300], target_text[:120]
    base_corpus = write_jsonl(work / "text" / "kobest.jsonl", base_text)
    target_corpus = write_jsonl(work / "text" / "korquad.jsonl", target_text)
    print(
        f"base text: KoBEST, {len(base_text):,} texts, {sum(map(len, base_text)):,} characters; "
        f"target: KorQuAD, {len(target_text):,} paragraphs, {sum(map(len, target_text)):,}"
    )

    from hanlm.stages import export

    base_values = {"corpus.inputs": [str(base_corpus)], "model.preset": "demo",
                   "pretrain.max_steps": args.base_steps,
                   "logging.eval_every": args.base_steps}  # fmt: skip
    cfg, base = train(work / "base", base_values)
    base_hf = work / "base-hf"
    if not base_hf.is_dir():
        export.export_chosen(cfg, work / "base", checkpoint=None, out=base_hf, force=False)
    print(f"base: {args.base_steps} steps on KoBEST, val bpb {base['pretrain'].val_bpb:.4f}")

    target = {"corpus.inputs": [str(target_corpus)], "pretrain.max_steps": args.steps,
              "logging.eval_every": args.steps}  # fmt: skip
    runs = {
        "scratch": {**target, "model.preset": "demo"},
        "continued": {**target, "model.init_from": str(base_hf)},
        "extended-pieces": {**target, "model.init_from": str(base_hf),
                            "tokenizer.extend": args.extend, "tokenizer.extend_init": "pieces"},
        "extended-mean": {**target, "model.init_from": str(base_hf),
                          "tokenizer.extend": args.extend, "tokenizer.extend_init": "mean"},
    }  # fmt: skip
    rows = []
    for name, values in runs.items():
        run_dir = work / name
        shutil.rmtree(run_dir / "pretrain", ignore_errors=True)  # each run trains afresh
        _, result = train(run_dir, values)
        tok, summary = result["tokenizer"], result["pretrain"]
        rows.append((name, tok, summary, result["seconds"]))
    tokens = args.steps * COMMON["pretrain.global_batch_tokens"]
    print(f"\n{tokens:,} tokens of KorQuAD per run ({args.steps} steps); held-out KorQuAD:")
    print("| run | vocabulary | chars/token | val loss | val bits/byte | seconds |")
    print("|---|---|---|---|---|---|")
    for name, tok, summary, seconds in rows:
        cpt = f"{tok.heldout.chars_per_token:.3f}"
        if tok.heldout_before is not None and tok.added_tokens:
            cpt = f"{tok.heldout_before.chars_per_token:.3f} -> {cpt}"
        print(
            f"| {name} | {tok.vocab_size:,} | {cpt} | {summary.val_loss:.4f} | "
            f"{summary.val_bpb:.4f} | {seconds:.0f} |"
        )
    bpb = {name: summary.val_bpb for name, _, summary, _ in rows}
    print(
        f"\ncontinued - scratch: {bpb['continued'] - bpb['scratch']:+.4f} bits/byte; "
        f"pieces - mean: {bpb['extended-pieces'] - bpb['extended-mean']:+.4f} bits/byte "
        "(negative: the first is better)"
    )
    print(f"runs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
