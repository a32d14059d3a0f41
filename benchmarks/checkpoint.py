"""Seconds the training loop is blocked per checkpoint: asynchronous against synchronous saves.

The `demo` preset trains in one process on an injected slow disk (every file write waits
HANLM_FAULT_WRITE_DELAY_S seconds first). Both modes save the same model and optimizer at the
same steps; we time how long `save()` holds the loop (for async: staging, plus waiting for a
previous save still in flight). Target: async blocks for at most 20% of the sync time.

    python benchmarks/checkpoint.py [--delay 1.0] [--saves 4] [--steps-between 3]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay", type=float, default=1.0, help="injected seconds per file write")
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--steps-between", type=int, default=3)
    args = parser.parse_args()
    os.environ["HANLM_FAULT_WRITE_DELAY_S"] = str(args.delay)

    from hanlm import model as model_lib
    from hanlm.data.loader import TokenLoader
    from hanlm.train import checkpoint_layout, parallel, precision
    from hanlm.train.checkpoint_manager import CheckpointManager
    from hanlm.train.optim import adamw
    from hanlm.train.trainer import Schedule, Trainer, TrainerSettings

    d = parallel.init("cpu")
    config = model_lib.model_config("demo", vocab_size=4096, seq_len=256)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "train.bin"
        np.random.default_rng(0).integers(0, 4096, size=2_000_000, dtype=np.uint16).tofile(shard)
        for mode in ("sync", "async"):
            torch.manual_seed(0)
            model = model_lib.build_model(config, seed=0)
            manager = CheckpointManager(
                Path(tmp) / mode,
                d,
                checkpoint_layout.Policy(async_save=mode == "async", keep_last=2),
            )
            trainer = Trainer(
                model=model,
                optimizer=adamw(
                    model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=d.device
                ),
                train_loader=TokenLoader([shard], dtype="uint16", seq_len=256, micro_batch=4),
                val_loader=None,
                schedule=Schedule(10**6, 1e-3, 0, 0.1, "cosine", 0.2),
                settings=TrainerSettings(1, 1.0, 10, 0, 1, 0, 1.0, 1.0, "bench"),
                dist=d,
                mode="single",
                numerics=precision.resolve("fp32", d.device),
                metrics_path=Path(tmp) / mode / "metrics.jsonl",
                checkpoints=manager,
            )
            blocked, step_times = [], []
            for _ in range(args.saves):
                for _ in range(args.steps_between):
                    start = time.perf_counter()
                    trainer.train_step()
                    # what the loop does every step: commit a save once it is written
                    pending, _ = manager.local_flags()
                    manager.finish_if_written(any_pending=bool(pending))
                    step_times.append(time.perf_counter() - start)
                blocked.append(trainer.save())
            start = time.perf_counter()
            manager.close()
            tail = time.perf_counter() - start
            assert len(checkpoint_layout.committed(manager.root)) == 2
            results[mode] = (statistics.mean(blocked), statistics.median(step_times), tail)

    print(
        f"demo preset ({model_lib.describe(config)}), {args.saves} checkpoints, "
        f"{args.steps_between} steps apart, injected write delay {args.delay:.2f}s per file"
    )
    for mode, (blocked, step, tail) in results.items():
        print(
            f"{mode:5s}: loop blocked {blocked:6.3f}s per checkpoint (median step {step:.3f}s; final wait {tail:.2f}s)"
        )
    ratio = results["async"][0] / results["sync"][0]
    print(f"ratio async / sync blocked time = {ratio:.3f}  (target <= 0.20)")


if __name__ == "__main__":
    main()
