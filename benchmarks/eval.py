"""Wall time of the five KoBEST tasks: hanlm's harness against lm-evaluation-harness's HF backend.

Same model folder (the `demo` preset, randomly initialised, with a byte-level BPE tokenizer trained
on KoBEST train text), same dev items (the first --items of each task from ../shared/data/kobest),
same machine, same batch size, fp32. lm-evaluation-harness runs its own kobest task YAMLs with the
data pointed at a local JSONL copy of the same items. Two timings each:

- eval: scoring the five tasks with the model already loaded (what the harness itself costs);
- end to end: also loading the model and building the tasks.

Per-item predictions (argmax over choices) must be identical. Target: eval ratio >= 2.

    python benchmarks/eval.py [--items 100] [--batch-size 32] [--preset demo] [--device cpu]
"""

from __future__ import annotations

import sys

# Keep the script's own folder off the import path (benchmarks/tokenize.py shadows the stdlib).
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KOBEST = ROOT.parent / "shared" / "data" / "kobest"
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
    from hanlm.evals import readers
    from hanlm.model import build_model as build
    from hanlm.model import model_config

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


def hf_rows(items, name: str) -> list[dict]:
    rows = []
    for item in items:
        f = dict(item.fields)
        if name == "kobest_hellaswag":
            f.update({f"ending_{i + 1}": e for i, e in enumerate(f.pop("endings"))})
        rows.append(f)
    return rows


def kobest_task_manager():
    """lm-evaluation-harness's task index of its kobest folder alone (all of it takes ~1 min)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = Path(lm_eval.__file__).parent / "tasks" / "kobest"
    return TaskManager(include_path=str(folder), include_defaults=False)


def lm_eval_tasks(data: dict[str, Path]) -> dict:
    from lm_eval.api.task import ConfigurableTask

    manager = kobest_task_manager()
    tasks = {}
    for name, path in data.items():
        overrides = {
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {"validation": str(path)}},
            "training_split": None,
            "test_split": None,
            "validation_split": "validation",
        }
        config = manager._factory._load_full_config(manager._entry(name), overrides)
        for key in ("tag", "group", "task_list"):
            config.pop(key, None)
        tasks[name] = ConfigurableTask(config=config)
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100, help="dev items per task")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2, help="alternating timed rounds")
    args = parser.parse_args()
    if not KOBEST.is_dir():
        sys.exit(f"KoBEST data not found at {KOBEST}")

    import torch

    from hanlm.evals import tasks as tasks_lib
    from hanlm.evals.harness import Model

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    torch.set_num_threads(torch.get_num_threads())
    work = Path(tempfile.mkdtemp(prefix="hanlm-bench-eval-"))
    model_dir = build_model(work / "model", args.preset, args.vocab)
    items, data = {}, {}
    for name, folder in TASKS.items():
        task = tasks_lib.get(name)
        items[name] = task.load(
            str(KOBEST / folder / "dev.tsv"), run_dir=None, options=tasks_lib.Options()
        )[: args.items]
        data[name] = work / f"{name}.jsonl"
        data[name].write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in hf_rows(items[name], name))
        )

    # Load both, then time the scoring alternately (the machine may be shared: min of repeats).
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM

    t0 = time.perf_counter()
    model = Model(model_dir, device=args.device, batch_size=args.batch_size)
    hanlm_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    baseline = HFLM(
        pretrained=str(model_dir), device=args.device, batch_size=args.batch_size, dtype="float32"
    )
    tasks = lm_eval_tasks(data)
    base_load = time.perf_counter() - t0
    hanlm_times, base_times = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ours = {n: tasks_lib.get(n).evaluate(model, items[n], tasks_lib.Options()) for n in TASKS}
        hanlm_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = lm_evaluate(lm=baseline, task_dict=tasks, log_samples=True, verbosity="ERROR")
        base_times.append(time.perf_counter() - t0)
        tasks = lm_eval_tasks(data)  # a task keeps its instances: fresh ones for the next round
    hanlm_eval, base_eval = min(hanlm_times), min(base_times)
    hanlm_total, base_total = hanlm_load + hanlm_eval, base_load + base_eval

    same, worst = 0, 0.0
    total = 0
    for name in TASKS:
        theirs = sorted(out["samples"][name], key=lambda s: s["doc_id"])
        for mine, ref in zip(ours[name], theirs, strict=True):
            lls = [float(r[0][0]) for r in ref["resps"]]
            ref_pred = max(range(len(lls)), key=lambda i: (lls[i], -i))
            same += mine["prediction"] == ref_pred
            worst = max(
                worst, max(abs(a - b) for a, b in zip(mine["loglikelihoods"], lls, strict=True))
            )
            total += 1
    print(
        f"model: {args.preset} preset, vocab {args.vocab}, {args.device}, fp32, "
        f"batch {args.batch_size}; {args.items} dev items x 5 tasks ({total} items)"
    )
    print(f"identical predictions: {same}/{total}; max |loglik difference| {worst:.2e}")
    print(
        f"rounds (s): hanlm {[round(t, 2) for t in hanlm_times]}, "
        f"lm-eval {[round(t, 2) for t in base_times]}"
    )
    print(
        f"eval only   hanlm {hanlm_eval:7.2f} s  lm-eval {base_eval:7.2f} s  "
        f"ratio {base_eval / hanlm_eval:.2f}x"
    )
    print(
        f"end to end  hanlm {hanlm_total:7.2f} s  lm-eval {base_total:7.2f} s  "
        f"ratio {base_total / hanlm_total:.2f}x"
    )


if __name__ == "__main__":
    main()
