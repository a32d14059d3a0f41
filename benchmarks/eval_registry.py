"""KMMLU, HAE-RAE and CLIcK as lm-evaluation-harness defines them: hanlm's harness against lm-eval's
HF backend on the same requests.

Both sides run lm-eval's own task definitions (its registry's YAML and utils: prompts, choices,
few-shot, metrics) on the same local copies in the published layouts (tests/support/
published_layouts.py: made-up Korean items with each data set's fields; --items per config), so
the requests are the same by construction; what differs is what scores them: hanlm through
`hanlm.evals.lm_eval_model.HarnessLM` (its batched harness), lm-eval through `HFLM`. Same model
folder (the `demo` preset, randomly initialised, a BPE tokenizer trained on the items' text), CPU,
fp32, one process. Per task: items, identical predictions, the largest per-choice
log-likelihood difference, acc of both, and the wall and CPU time of both (evaluate() only,
models loaded; per task alternately, the fastest of --repeats rounds).

    python benchmarks/eval_registry.py [--items 200] [--batch-size 32] [--repeats 1] [--threads 1]
"""

from __future__ import annotations

import sys

# Keep the script's own folder off the import path (benchmarks/tokenize.py shadows the stdlib).
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import contextlib
import json
import logging
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
import published_layouts

TASKS = ["kmmlu_accounting", "kmmlu_korean_history", "haerae_general_knowledge", "haerae_history"]
TASKS += ["click_cul_economy", "click_cul_history"]
LOCAL = {
    "kmmlu": "HAERAE-HUB/KMMLU",
    "haerae": "HAERAE-HUB/HAE_RAE_BENCH",
    "click": "EunsuKim/CLIcK",
}


def build_model(out: Path, texts: list[str], preset: str, vocab: int) -> Path:
    import torch

    from hanlm.data import tokenizer as tok_lib
    from hanlm.model import build_model as build
    from hanlm.model import model_config

    tok = tok_lib.train(texts, vocab, 2, 8)
    tok_lib.save(tok, out)
    torch.manual_seed(0)
    config = model_config(preset, vocab_size=tok_lib.round_up(tok.get_vocab_size()), seq_len=2048)
    build(config).save_pretrained(out)
    return out


@contextlib.contextmanager
def timed(into: list):
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into.append((time.perf_counter() - wall, time.process_time() - cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200, help="test items per config")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args()

    import torch
    from lm_eval.evaluator import evaluate as lm_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from hanlm.evals.harness import Model
    from hanlm.evals.tasks import Options, lm_eval_registry

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="hanlm-bench-eval-registry-"))
    data = work / "data"
    published_layouts.write_kmmlu(data, args.items)
    published_layouts.write_haerae(data, args.items)
    published_layouts.write_click(data, args.items)

    ours_tasks = {name: lm_eval_registry.LmEvalTask(name) for name in TASKS}
    items = {
        n: t.load(str(data), demo_files=None, options=Options()) for n, t in ours_tasks.items()
    }
    texts = [i.overlap_text for found in items.values() for i in found]
    model_dir = build_model(work / "model", texts, args.preset, args.vocab)
    model = Model(model_dir, device="cpu", batch_size=args.batch_size)
    baseline = HFLM(pretrained=str(model_dir), device="cpu", batch_size=args.batch_size,
                    dtype="float32")  # fmt: skip

    # lm-eval's tasks with their dataset_path on the local copies: a task file of the user's
    # (a cache of their own: datasets would otherwise read an earlier copy's cached rows)
    cache = {"cache_dir": str(work / "datasets-cache")}
    members = [
        {"task": n, "dataset_path": str(data / LOCAL[n.split("_")[0]]), "dataset_kwargs": cache}
        for n in TASKS
    ]
    (work / "tasks").mkdir()
    (work / "tasks" / "bench.yaml").write_text(json.dumps({"group": "bench", "task": members}))
    folders = [published_layouts.REGISTRY_FOLDERS[f] for f in ("kmmlu", "haerae", "click")]
    manager = TaskManager(include_path=[*folders, str(work / "tasks")], include_defaults=False)

    times = {n: {"hanlm": [], "lm-eval": []} for n in TASKS}
    ours, theirs, results = {}, {}, {}
    for _ in range(args.repeats):
        fresh = manager.load(["bench"])["tasks"]  # built outside the timing
        for name in TASKS:
            with timed(times[name]["hanlm"]):
                ours[name] = ours_tasks[name].evaluate(model, items[name], Options())
            with timed(times[name]["lm-eval"]):
                out = lm_evaluate(lm=baseline, task_dict={"tasks": {name: fresh[name]}},
                                  log_samples=True, bootstrap_iters=0)  # fmt: skip
            theirs[name] = sorted(out["samples"][name], key=lambda s: s["doc_id"])
            results[name] = out["results"][name]

    print(
        f"model: {args.preset} preset, vocab {args.vocab}, cpu, fp32, batch {args.batch_size}, "
        f"{torch.get_num_threads()} torch thread(s); {args.items} items per config (look-alike "
        f"data, published layouts); fastest of {args.repeats} round(s)"
    )
    print(
        f"{'task':26} {'items':>6} {'same pred':>9} {'max|dll|':>9} {'acc hanlm':>9} "
        f"{'lm-eval':>8} {'wall hanlm':>10} {'lm-eval':>8} {'ratio':>6} {'cpu hanlm':>9} "
        f"{'lm-eval':>8} {'ratio':>6}"
    )
    totals = {"hanlm": [0.0, 0.0], "lm-eval": [0.0, 0.0]}
    for name in TASKS:
        same, worst = 0, 0.0
        for mine, ref in zip(ours[name], theirs[name], strict=True):
            lls = [float(r[0][0]) for r in ref["resps"]]
            same += mine["prediction"] == max(range(len(lls)), key=lambda i: (lls[i], -i))
            gaps = (abs(a - b) for a, b in zip(mine["loglikelihoods"], lls, strict=True))
            worst = max(worst, *gaps)
        acc = sum(s["scores"]["acc"] for s in ours[name]) / len(ours[name])
        best = {side: min(times[name][side]) for side in totals}
        for side in totals:
            totals[side][0] += best[side][0]
            totals[side][1] += best[side][1]
        print(
            f"{name:26} {len(ours[name]):>6} {same:>9} {worst:>9.1e} {acc:>9.4f} "
            f"{results[name]['acc,none']:>8.4f} {best['hanlm'][0]:>10.2f} "
            f"{best['lm-eval'][0]:>8.2f} {best['lm-eval'][0] / best['hanlm'][0]:>5.2f}x "
            f"{best['hanlm'][1]:>9.2f} {best['lm-eval'][1]:>8.2f} "
            f"{best['lm-eval'][1] / best['hanlm'][1]:>5.2f}x"
        )
    (hw, hc), (lw, lc) = totals["hanlm"], totals["lm-eval"]
    print(f"{'all':26} {'':>6} {'':>9} {'':>9} {'':>9} {'':>8} {hw:>10.2f} {lw:>8.2f} "
          f"{lw / hw:>5.2f}x {hc:>9.2f} {lc:>8.2f} {lc / hc:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
