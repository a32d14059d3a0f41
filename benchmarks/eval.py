"""The five KoBEST tasks: hanlm's harness against lm-evaluation-harness's HF backend.

hanlm reads the KoBEST TSV release from ../shared/data/kobest itself; lm-evaluation-harness runs
its own kobest task YAMLs on skt/kobest_v1 as published, which this script builds from the same
TSVs by the publisher's procedure (pandas read_csv(sep="\\t"), dropna(), columns renamed, labels
mapped; docs/kobest.md) and saves as JSON lines. So the run checks hanlm's reading of the TSV as
well as its scoring. Same model folder (the `demo` preset, randomly initialised, with a byte-level
BPE tokenizer trained on KoBEST train text), same machine, same batch size, fp32.

By default every train and dev item of the five tasks is scored (--no-all-items: the first
--items dev items of each, for a quicker timing). Per task it prints: items, how many are scored
on identical text ((context, continuation) pairs), identical predictions (argmax over choices),
the largest per-choice log-likelihood difference, acc of both, and the scoring time of both
(models loaded, timed per task alternately; the fastest of --repeats rounds), wall and CPU.
Targets: identical text and predictions on every item; eval ratio >= 2.

    python benchmarks/eval.py [--no-all-items --items 50] [--tasks kobest_boolq,...]
                              [--batch-size 32] [--repeats 1] [--threads 1]
"""

from __future__ import annotations

import sys

# Keep the script's own folder off the import path (benchmarks/tokenize.py shadows the stdlib).
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import contextlib
import logging
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KOBEST = ROOT.parent / "shared" / "data" / "kobest"
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the reference side the conformance test uses
from kobest_reference import kobest_task_manager, lm_eval_task, publish

TASKS = {
    "kobest_boolq": "BoolQ",
    "kobest_copa": "COPA",
    "kobest_hellaswag": "HellaSwag",
    "kobest_sentineg": "SentiNeg",
    "kobest_wic": "WiC",
}


def build_model(out: Path, preset: str, vocab: int) -> Path:
    """A randomly initialised model with a Korean tokenizer, saved as a Hugging Face folder."""
    import torch

    from hanlm.data import tokenizer as tok_lib
    from hanlm.model import build_model as build
    from hanlm.model import model_config
    from hanlm.testsets import readers

    texts = []
    for name, folder in TASKS.items():
        texts += [item.overlap_text for item in readers.read(name, KOBEST / folder / "train.tsv")]
    tok = tok_lib.train(texts, vocab, 2, 8)
    tok_lib.save(tok, out)
    vocab_size = tok_lib.round_up(tok.get_vocab_size())
    torch.manual_seed(0)
    model = build(model_config(preset, vocab_size=vocab_size, seq_len=2048))
    model.save_pretrained(out)
    return out


@contextlib.contextmanager
def timed(into: list):
    """Append (wall seconds, process CPU seconds over all threads) of the block to `into`."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into.append((time.perf_counter() - wall, time.process_time() - cpu))


def compare(task, items, ours, theirs) -> dict:
    """Per task: identical scored text, identical predictions, largest log-likelihood gap."""
    same_text = same_prediction = 0
    worst = 0.0
    for item, mine, ref in zip(items, ours, theirs, strict=True):
        pairs = [
            (task.context(item.fields), task.target_delimiter + c)
            for c in task.choices(item.fields)
        ]
        same_text += [tuple(a) for a in ref["arguments"]] == pairs
        lls = [float(r[0][0]) for r in ref["resps"]]
        ref_prediction = max(range(len(lls)), key=lambda i: (lls[i], -i))  # first of equal maxima
        same_prediction += mine["prediction"] == ref_prediction
        worst = max(worst, *(abs(a - b) for a, b in zip(mine["loglikelihoods"], lls, strict=True)))
    return {"same_text": same_text, "same_prediction": same_prediction, "worst": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--all-items",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every train and dev item (default); --no-all-items: the first --items dev items",
    )
    parser.add_argument("--items", type=int, default=50, help="dev items per task, --no-all-items")
    parser.add_argument(
        "--tasks", default=",".join(TASKS), help="comma-separated subset of the five tasks"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1, help="alternating timed rounds")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default); 1 keeps timings steadier on a shared machine",
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    if not names or not set(names) <= set(TASKS):
        sys.exit(f"--tasks: choose from {', '.join(TASKS)}")
    if not KOBEST.is_dir():
        sys.exit(f"KoBEST data not found at {KOBEST}")

    import torch
    from datasets import concatenate_datasets
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM

    from hanlm.evals import tasks as tasks_lib
    from hanlm.evals.harness import Model

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="hanlm-bench-eval-"))
    model_dir = build_model(work / "model", args.preset, args.vocab)
    splits = ("train", "dev") if args.all_items else ("dev",)
    items, data = {}, {}
    for name in names:
        folder, task, items[name], published = TASKS[name], tasks_lib.get(name), [], []
        for split in splits:
            tsv = KOBEST / folder / f"{split}.tsv"
            loaded = task.load(str(tsv), demo_files=None, options=tasks_lib.Options())  # the TSV
            dataset = publish(tsv, name)  # skt/kobest_v1 as published, for lm-eval
            if not args.all_items:
                loaded, dataset = loaded[: args.items], dataset.select(range(args.items))
            items[name] += loaded
            published.append(dataset)
        data[name] = work / f"{name}.jsonl"
        concatenate_datasets(published).to_json(data[name], force_ascii=False)

    t0 = time.perf_counter()
    model = Model(model_dir, device=args.device, batch_size=args.batch_size)
    hanlm_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    baseline = HFLM(
        pretrained=str(model_dir), device=args.device, batch_size=args.batch_size, dtype="float32"
    )
    base_load = time.perf_counter() - t0
    manager = kobest_task_manager()

    # Per task, alternately (the machine may be shared: the fastest of the rounds counts, and CPU
    # time, all threads, is printed too). A task keeps its instances, so lm-eval gets a fresh one
    # each round, built outside the timing.
    times = {name: {"hanlm": [], "lm-eval": []} for name in names}
    ours, theirs, results = {}, {}, {}
    for _ in range(args.repeats):
        for name in names:
            task = tasks_lib.get(name)
            with timed(times[name]["hanlm"]):
                ours[name] = task.evaluate(model, items[name], tasks_lib.Options())
            fresh = {name: lm_eval_task(manager, name, data[name])}
            with timed(times[name]["lm-eval"]):
                out = lm_evaluate(lm=baseline, task_dict=fresh, log_samples=True, verbosity="ERROR")
            theirs[name] = sorted(out["samples"][name], key=lambda s: s["doc_id"])
            results[name] = out["results"][name]

    scope = "every train+dev item" if args.all_items else f"the first {args.items} dev items"
    print(
        f"model: {args.preset} preset, vocab {args.vocab}, {args.device}, fp32, batch "
        f"{args.batch_size}, {torch.get_num_threads()} torch thread(s); {scope} of {len(names)} task(s); hanlm reads the TSVs, lm-eval "
        f"skt/kobest_v1 as published; fastest of {args.repeats} round(s); model load hanlm "
        f"{hanlm_load:.2f} s, lm-eval {base_load:.2f} s"
    )
    print(
        f"{'task':18} {'items':>6} {'same text':>10} {'same pred':>10} {'max|dll|':>9} "
        f"{'acc hanlm':>9} {'acc lm-eval':>11} {'wall s hanlm':>12} {'lm-eval':>8} {'ratio':>6} "
        f"{'cpu s hanlm':>11} {'lm-eval':>8} {'ratio':>6}"
    )
    keys = ("items", "same_text", "same_prediction")
    totals = {**dict.fromkeys(keys, 0), "worst": 0.0, "wall": [0.0, 0.0], "cpu": [0.0, 0.0]}
    for name in names:
        task = tasks_lib.get(name)
        found = {"items": len(items[name]), **compare(task, items[name], ours[name], theirs[name])}
        acc = sum(s["scores"]["acc"] for s in ours[name]) / found["items"]
        (h_wall, h_cpu), (b_wall, b_cpu) = min(times[name]["hanlm"]), min(times[name]["lm-eval"])
        print(
            f"{name:18} {found['items']:6d} {found['same_text']:10d} "
            f"{found['same_prediction']:10d} {found['worst']:9.2e} {acc:9.4f} "
            f"{results[name]['acc,none']:11.4f} {h_wall:12.2f} {b_wall:8.2f} "
            f"{b_wall / h_wall:5.2f}x {h_cpu:11.2f} {b_cpu:8.2f} {b_cpu / h_cpu:5.2f}x"
        )
        for key in keys:
            totals[key] += found[key]
        totals["worst"] = max(totals["worst"], found["worst"])
        totals["wall"] = [totals["wall"][0] + h_wall, totals["wall"][1] + b_wall]
        totals["cpu"] = [totals["cpu"][0] + h_cpu, totals["cpu"][1] + b_cpu]
    (h_wall, b_wall), (h_cpu, b_cpu) = totals["wall"], totals["cpu"]
    print(
        f"{'all':18} {totals['items']:6d} {totals['same_text']:10d} "
        f"{totals['same_prediction']:10d} {totals['worst']:9.2e} {'':9} {'':11} "
        f"{h_wall:12.2f} {b_wall:8.2f} {b_wall / h_wall:5.2f}x "
        f"{h_cpu:11.2f} {b_cpu:8.2f} {b_cpu / h_cpu:5.2f}x"
    )


if __name__ == "__main__":
    main()
