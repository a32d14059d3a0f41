"""Distillation ablation: the same student trained with and without a teacher, side by side.

On the demo world (corpus -> tokenizer -> shards), a larger teacher (preset `demo`) is trained
and exported; then the same student (preset `tiny`, same seed, same data order, same steps) is
trained twice: plain cross-entropy, and (1 - alpha)*CE + alpha*T^2*KL toward the teacher. Both are
scored by the same validation cross-entropy and bits per byte (the Trainer's evaluation, which
ignores the training loss). A field report saw distillation toward a bigger teacher hurt: this
measures instead of hoping.

    python benchmarks/distill_ablation.py [--student-steps 60] [--teacher-steps 120]
        [--teacher-lr 3e-3] [--alpha 0.5] [--temperature 2.0] [--work DIR]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import shutil
import tempfile
import time
from pathlib import Path

DATA = {
    "demo.size_mb": 0.8,
    "corpus.part_chars": 80_000,
    "tokenizer.vocab_size": 1024,
    "data_engine.workers": 1,
    "shards.val_fraction": 0.05,
}
TRAIN = {
    "pretrain.seq_len": 64,
    "pretrain.micro_batch": 8,
    "pretrain.global_batch_tokens": 1024,
    "precision.mode": "fp32",
    "optimizer.warmup_steps": 5,
    "logging.log_every": 20,
    "logging.eval_batches": 8,
    "checkpoint.every": 0,
    "parallel.device": "cpu",
    "checkpoint.async_save": False,
}


def config(values: dict):
    from hanlm.config import load_config

    return load_config(values={**DATA, **TRAIN, **values})


def train(base: Path, name: str, values: dict) -> tuple[Path, dict, float]:
    from hanlm.pipeline import run_stage

    run_dir = base / name
    if not run_dir.exists():  # an existing one resumes, or is skipped when finished
        shutil.copytree(base / "data", run_dir)
    cfg = config(values)
    started = time.perf_counter()
    summary = run_stage("pretrain", cfg, run_dir)
    return run_dir, summary, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher-steps", type=int, default=120)
    parser.add_argument("--student-steps", type=int, default=60)
    parser.add_argument("--teacher-lr", type=float, default=3e-3)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="keep the runs here (default: a temp folder)")
    args = parser.parse_args()

    from hanlm.config import load_config
    from hanlm.pipeline import run_pipeline
    from hanlm.stages import export

    base = args.work or Path(tempfile.mkdtemp(prefix="hanlm-distill-"))
    base.mkdir(parents=True, exist_ok=True)
    run_pipeline(load_config(values=DATA), base / "data", until="shards")

    seed = {"run.seed": args.seed}
    teacher_values = {
        **seed,
        "model.preset": "demo",
        "pretrain.max_steps": args.teacher_steps,
        "optimizer.lr": args.teacher_lr,
        "logging.eval_every": args.teacher_steps,
    }
    teacher_dir, teacher, _ = train(base, "teacher", teacher_values)
    teacher_hf = teacher_dir / "pretrain" / "hf"
    export.export_chosen(
        config(teacher_values), teacher_dir, checkpoint=None, out=teacher_hf, force=False
    )

    student = {
        **seed,
        "model.preset": "tiny",
        "pretrain.max_steps": args.student_steps,
        "optimizer.lr": 1e-2,
        "logging.eval_every": args.student_steps,
    }
    _, plain, plain_s = train(base, "student-ce", student)
    _, distilled, distilled_s = train(
        base,
        "student-kd",
        {
            **student,
            "distill.enabled": True,
            "distill.teacher": str(teacher_hf),
            "distill.alpha": args.alpha,
            "distill.temperature": args.temperature,
        },
    )

    rows = [
        ("teacher (demo preset)", args.teacher_steps, teacher, None),  # not part of the race
        ("student, CE only", args.student_steps, plain, plain_s),
        (f"student, KD a={args.alpha} T={args.temperature}", args.student_steps, distilled, distilled_s),
    ]  # fmt: skip
    print("\n| model | steps | val loss (CE) | val bits/byte | train time s |")
    print("|---|---|---|---|---|")
    for name, steps, summary, seconds in rows:
        print(
            f"| {name} | {steps} | {summary.val_loss:.4f} | {summary.val_bpb:.4f} | "
            f"{'–' if seconds is None else f'{seconds:.1f}'} |"
        )
    delta = distilled.val_loss - plain.val_loss
    verdict = "better" if delta < 0 else "worse"
    print(f"\nKD - CE val loss: {delta:+.4f} nats/token: distillation is {verdict} here.")
    print(f"runs in {base}")


if __name__ == "__main__":
    main()
