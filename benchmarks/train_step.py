"""Tokens/s of hanlm's training step against the floor: a minimal plain-PyTorch loop.

Both train the same transformers model (same preset, same initial weights, same AdamW settings)
on same-shaped batches in one process, in interleaved rounds. The floor is forward, loss,
backward, AdamW step on pre-made tensors; hanlm's step adds what a real run needs: the resumable
loader (read ahead in a thread), the schedule, the global token count (counted on the host,
divided out of the gradients after the backward), gradient clipping. Target on CPU: >= 0.95x.

    python benchmarks/train_step.py [--preset demo] [--seq-len 256] [--micro-batch 8]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import copy
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    from hanlm import model as model_lib
    from hanlm.data.loader import TokenLoader
    from hanlm.plan.catalogue import device_peak_flops
    from hanlm.train import checkpoint_layout, parallel, precision
    from hanlm.train.checkpoint_manager import CheckpointManager
    from hanlm.train.optim import adamw
    from hanlm.train.trainer import Schedule, Trainer, TrainerSettings

    torch.manual_seed(0)
    d = parallel.init("cpu")
    config = model_lib.model_config(args.preset, vocab_size=args.vocab, seq_len=args.seq_len)
    base = model_lib.build_model(config, seed=0)
    hyper = {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8, "device": d.device}
    tokens_per_step = args.micro_batch * args.seq_len

    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "train-00000.bin"
        rng = np.random.default_rng(0)
        need = tokens_per_step * args.steps * args.rounds * 2 + 1
        rng.integers(0, args.vocab, size=need, dtype=np.uint16).tofile(shard)

        # The floor: the loop everyone writes first.
        floor_model = copy.deepcopy(base)
        floor_opt = adamw(floor_model, **hyper)
        floor_batches = [
            (
                torch.from_numpy(b[:, :-1].astype(np.int64)),
                torch.from_numpy(b[:, 1:].astype(np.int64)),
            )
            for b in rng.integers(
                0, args.vocab, size=(args.steps, args.micro_batch, args.seq_len + 1)
            )
        ]

        def floor_step(x, y) -> None:
            logits = floor_model(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            loss.backward()
            floor_opt.step()
            floor_opt.zero_grad(set_to_none=True)

        # hanlm: the trainer's step over a real loader.
        hanlm_model = copy.deepcopy(base)
        loader = TokenLoader(
            [shard], dtype="uint16", seq_len=args.seq_len, micro_batch=args.micro_batch
        )
        numerics = precision.resolve("fp32", d.device)
        flops = model_lib.flops_per_token(config, args.seq_len)["total"]
        trainer = Trainer(
            model=hanlm_model,
            optimizer=adamw(hanlm_model, **hyper),
            train_loader=loader,
            val_loader=None,
            schedule=Schedule(10**6, 1e-3, 10, 0.1, "cosine", 0.2),
            settings=TrainerSettings(
                1, 1.0, 10, 0, 1, 0, flops, device_peak_flops(d.device, "fp32")[0], "bench"
            ),
            dist=d,
            mode="single",
            numerics=numerics,
            metrics_path=Path(tmp) / "out" / "metrics.jsonl",
            checkpoints=CheckpointManager(
                Path(tmp) / "out" / "checkpoints", d, checkpoint_layout.Policy()
            ),
        )

        floor_step(*floor_batches[0])  # warm-up both
        trainer.train_step()

        def run_floor() -> None:
            for x, y in floor_batches:
                floor_step(x, y)

        def run_hanlm() -> None:
            for _ in range(args.steps):
                trainer.train_step()

        # Interleaved rounds, alternating which goes first; the best round of each counts.
        best = {"floor": 0.0, "hanlm": 0.0}
        contenders = [("floor", run_floor), ("hanlm", run_hanlm)]
        for round_ in range(args.rounds):
            for name, fn in contenders if round_ % 2 == 0 else contenders[::-1]:
                start = time.perf_counter()
                fn()
                rate = tokens_per_step * args.steps / (time.perf_counter() - start)
                best[name] = max(best[name], rate)

    peak = device_peak_flops(d.device, "fp32")[0]
    print(
        f"{model_lib.describe(config)}; batch {args.micro_batch} x {args.seq_len}; fp32 on "
        f"{os.cpu_count()} CPU cores, torch {torch.__version__}; best of {args.rounds} rounds of {args.steps} steps"
    )
    for name, tps in best.items():
        print(
            f"{name:6s}: {tps:8,.0f} tokens/s   MFU {tps * flops / peak:5.1%} (of measured fp32 matmul peak)"
        )
    print(f"ratio hanlm / floor = {best['hanlm'] / best['floor']:.3f}  (target >= 0.95)")


if __name__ == "__main__":
    main()
