"""Muon against a tuned AdamW: the tokens each needs to reach the same held-out bits per byte.

On real Korean text (KorQuAD 1.0's Wikipedia paragraphs and KoBEST's texts, from the shared data
folder; none of it is in the repository), hanlm's pretraining trains two model sizes more than 3x
apart in parameters, each with AdamW and with Muon (`optimizer.name = "muon"`: Muon on the
blocks' matrices, AdamW on the embedding and norms, one learning rate for both with Moonlight's
`match_rms_adamw` rule), each over a sweep of 4 log-spaced peak learning rates at a fixed token
budget, same seed, same batches, cosine schedule. For each size it prints:

- the best final validation bits per byte of each optimizer (the Trainer's evaluation of the
  held-out split), and its learning rate;
- the tokens the best Muon run needed to reach the tuned AdamW's final figure (interpolated
  between evaluations) and the token-efficiency ratio: AdamW's tokens over Muon's;
- step time (tokens/s after the first log window) and the optimizer state's bytes;

and writes the loss-versus-tokens curves (`--out`, a PNG) and the figures (JSON beside it).

These are short horizons on a 2-core CPU: models of about 1M and 4M parameters and about a
million tokens, far below compute-optimal (20 tokens per parameter would be 20-80M). The
literature's comparisons (Wen et al. 2025, "Fantastic pretraining optimizers and where to find
them") found Muon's gain over a well-tuned AdamW shrinking with scale: about 1.3x at 0.1B and
1.1x at 1.2B parameters. Read these figures as what they are: a small-scale check.

    python benchmarks/optimizer.py                 # ~1 hour on 2 cores
    python benchmarks/optimizer.py --smoke         # ~30 s: the tests run it
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
_HERE = __file__.rsplit("/", 1)[0]
sys.path[:] = [p for p in sys.path if p not in ("", _HERE)]

import argparse
import importlib.util
import json
import shutil
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# model shapes (Llama, tied embeddings, vocabulary 4,096): ~1.2M and ~4.2M parameters
SIZES = {
    "S": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 384},
    "M": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 768},
}  # fmt: skip
LRS = (1.5e-3, 3e-3, 6e-3, 1.2e-2)  # log-spaced by 2x: the demo recipe's 3e-3 among them
TOKENS = {"S": 1_000_000, "M": 800_000}
DATA = {
    "decontam.enabled": False,  # benchmark text is only text to learn here
    "corpus.part_chars": 400_000,
    "data_engine.workers": 2,
    "shards.val_fraction": 0.04,
    "tokenizer.vocab_size": 4096,
}
TRAIN = {
    "pretrain.seq_len": 128,
    "pretrain.micro_batch": 16,
    "pretrain.global_batch_tokens": 2048,
    "pretrain.document_masking": False,
    "precision.mode": "fp32",  # bf16 matmuls are slow on this kind of CPU
    "optimizer.schedule": "cosine",
    "optimizer.min_lr_ratio": 0.1,
    "optimizer.weight_decay": 0.1,
    "optimizer.muon_adjust_lr": "match_rms_adamw",
    "logging.eval_batches": 24,
    "checkpoint.every": 0,
    "checkpoint.async_save": False,
    "parallel.device": "cpu",
    "run.seed": 0,
}
BYTES = 4  # float32 optimizer state


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"hanlm_bench_{name}", f"{_HERE}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_config_file(work: Path, size: str) -> Path:
    from hanlm.model_presets import PRESETS

    config = {**PRESETS["demo"], **SIZES[size], "model_type": "llama",
              "architectures": ["LlamaForCausalLM"], "vocab_size": 4096}  # fmt: skip
    path = work / "models" / size / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def optimizer_state_bytes(config_file: Path, vocab: int) -> dict[str, int]:
    """The optimizer state of each optimizer for this model: AdamW keeps two float32 moments
    for every parameter; Muon one momentum buffer per block matrix (AdamW's two elsewhere)."""
    from hanlm import model as model_lib
    from hanlm.train import muon, parallel

    config = model_lib.model_config(str(config_file), vocab_size=vocab, seq_len=128)
    model = model_lib.build_model(config, device="meta")
    parts = muon.split(model, parallel.decoder_layers(model))
    matrices = sum(p.numel() for _, p in parts.muon)
    rest = sum(p.numel() for _, p in parts.adamw)
    return {
        "parameters": matrices + rest,
        "adamw": 2 * BYTES * (matrices + rest),
        "muon": BYTES * matrices + 2 * BYTES * rest,
    }


def read_curve(run_dir: Path) -> tuple[list[tuple[int, float]], float | None]:
    """(tokens, validation bits per byte) at each evaluation; tokens/s after the first window."""
    records = [json.loads(x) for x in (run_dir / "pretrain" / "metrics.jsonl").open()]
    curve = [(r["tokens"], r["val_bpb"]) for r in records if r.get("val_bpb") is not None]
    speeds = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")][1:]
    return curve, (sum(speeds) / len(speeds) if speeds else None)


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """The tokens at which the curve first reaches `target` (linear between evaluations)."""
    previous = None
    for tokens, bpb in curve:
        if bpb <= target:
            if previous is None:
                return float(tokens)
            t0, b0 = previous
            return t0 + (tokens - t0) * (b0 - target) / (b0 - bpb)
        previous = (tokens, bpb)
    return None


def train(data_run: Path, run_dir: Path, values: dict) -> dict:
    from hanlm.config import load_config
    from hanlm.pipeline import run_stage

    if run_dir.exists():
        shutil.rmtree(run_dir)
    shutil.copytree(data_run, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    started = time.perf_counter()
    summary = run_stage("pretrain", load_config(values={**DATA, **TRAIN, **values}), run_dir)
    curve, tps = read_curve(run_dir)
    return {"final_bpb": summary.val_bpb, "curve": curve, "tokens_per_s": tps,
            "seconds": time.perf_counter() - started}  # fmt: skip


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    colours = {"adamw": "tab:blue", "muon": "tab:red"}
    for ax, (size, by_opt) in zip(axes[0], results.items(), strict=True):
        for opt, runs in by_opt.items():
            best = min(runs, key=lambda lr: runs[lr]["final_bpb"])
            for lr, run in runs.items():
                xs, ys = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
                ax.plot(xs, ys, color=colours[opt], alpha=1.0 if lr == best else 0.25,
                        label=f"{opt} lr {lr:g}" + (" (best)" if lr == best else ""))  # fmt: skip
        ax.set_title(f"size {size}")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("held-out bits per byte")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=SHARED)
    parser.add_argument("--work", type=Path, help="keep the runs here (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=Path("optimizer.png"))
    parser.add_argument("--smoke", action="store_true", help="a small sample, one rate, 4 steps")
    args = parser.parse_args()
    if not (args.data / "korquad").is_dir():
        print(f"no shared Korean data at {args.data}: give --data", file=sys.stderr)
        return 2
    lrs, tokens = LRS, dict(TOKENS)
    texts_of = _sibling("continued_pretraining")
    text = texts_of.korquad_texts(args.data) + texts_of.kobest_texts(args.data)
    if args.smoke:
        text, lrs, tokens = text[:300], LRS[1:2], {"S": 4 * 2048, "M": 4 * 2048}
        DATA.update({"shards.val_fraction": 0.2})
        TRAIN.update({"logging.eval_batches": 2})
    work = args.work or Path(tempfile.mkdtemp(prefix="hanlm-optimizer-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = texts_of.write_jsonl(work / "text" / "korean.jsonl", text)
    print(f"text: {len(text):,} KorQuAD and KoBEST texts, {sum(map(len, text)):,} characters")

    from hanlm.config import load_config
    from hanlm.pipeline import run_pipeline

    data_run = work / "data"
    DATA["corpus.inputs"] = [str(corpus)]
    run_pipeline(load_config(values={**DATA, **TRAIN}), data_run, until="shards")

    results: dict = {}
    report: dict = {"sizes": {}, "lrs": list(lrs), "tokens": tokens}
    for size in SIZES:
        config_file = model_config_file(work, size)
        steps = tokens[size] // TRAIN["pretrain.global_batch_tokens"]
        evals = max(1, steps // 10)
        state = optimizer_state_bytes(config_file, DATA["tokenizer.vocab_size"])
        results[size] = {}
        for opt in ("adamw", "muon"):
            results[size][opt] = {}
            for lr in lrs:
                values = {"model.preset": str(config_file), "optimizer.name": opt,
                          "optimizer.lr": lr, "pretrain.max_steps": steps,
                          "optimizer.warmup_steps": max(1, steps // 20),
                          "logging.eval_every": evals, "logging.log_every": evals}  # fmt: skip
                run = train(data_run, work / f"{size}-{opt}-{lr:g}", values)
                results[size][opt][lr] = run
                print(f"size {size} {opt} lr {lr:g}: final val bpb {run['final_bpb']:.4f} "
                      f"({run['seconds']:.0f} s)", flush=True)  # fmt: skip
        best = {opt: min(runs.items(), key=lambda kv: kv[1]["final_bpb"])
                for opt, runs in results[size].items()}  # fmt: skip
        target = best["adamw"][1]["final_bpb"]
        needed = tokens_to_reach(best["muon"][1]["curve"], target)
        report["sizes"][size] = {
            "parameters": state["parameters"],
            "tokens": tokens[size],
            "best": {opt: {"lr": lr, "final_bpb": run["final_bpb"],
                           "tokens_per_s": run["tokens_per_s"]} for opt, (lr, run) in best.items()},
            "muon_tokens_to_adamw_final": needed,
            "token_efficiency": None if needed is None else tokens[size] / needed,
            "step_time_ratio": best["adamw"][1]["tokens_per_s"] / best["muon"][1]["tokens_per_s"],
            # what a user pays: Muon's time to AdamW's final figure over AdamW's whole run
            "time_to_adamw_final_ratio": None if needed is None else (
                needed / best["muon"][1]["tokens_per_s"]
            ) / (tokens[size] / best["adamw"][1]["tokens_per_s"]),
            "optimizer_state_bytes": {k: state[k] for k in ("adamw", "muon")},
            "runs": {opt: {str(lr): run for lr, run in runs.items()}
                     for opt, runs in results[size].items()},
        }  # fmt: skip

    print("\n| size | params | tokens | AdamW best lr | AdamW bpb | Muon best lr | Muon bpb | "
          "Muon tokens to AdamW's bpb | token efficiency | Muon step time / AdamW's | "
          "Muon time to AdamW's bpb / AdamW's | optimizer state AdamW / Muon |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, row in report["sizes"].items():
        a, m = row["best"]["adamw"], row["best"]["muon"]
        needed = row["muon_tokens_to_adamw_final"]
        eff, wall = row["token_efficiency"], row["time_to_adamw_final_ratio"]
        st = row["optimizer_state_bytes"]
        print(
            f"| {size} | {row['parameters'] / 1e6:.2f}M | {row['tokens']:,} | {a['lr']:g} | "
            f"{a['final_bpb']:.4f} | {m['lr']:g} | {m['final_bpb']:.4f} | "
            f"{'not reached' if needed is None else f'{needed:,.0f}'} | "
            f"{'-' if eff is None else f'{eff:.2f}x'} | {row['step_time_ratio']:.2f} | "
            f"{'-' if wall is None else f'{wall:.2f}'} | "
            f"{st['adamw'] / 2**20:.1f} / {st['muon'] / 2**20:.1f} MiB |"
        )
    verdicts = []
    for size, row in report["sizes"].items():
        eff, ratio = row["token_efficiency"], row["step_time_ratio"]
        met = eff is not None and eff >= 1.25 and ratio <= 1.10
        verdicts.append(met)
        print(f"size {size}: {'meets' if met else 'MISSES'} the bar (>= 1.25x token efficiency, "
              f"step time within 10%): {'-' if eff is None else f'{eff:.2f}x'}, "
              f"{ratio:.2f}x step time")  # fmt: skip
    report["verdict"] = "muon" if all(verdicts) else "adamw"
    print(f"default by this measurement: {report['verdict']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(results, args.out)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"curves: {args.out}; figures: {args.out.with_suffix('.json')}; runs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
