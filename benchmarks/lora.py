"""LoRA SFT against full fine-tuning: peak memory and step time, side by side, and the planner.

The same SFT training step twice on the same model and data, at the 125m preset on the CPU:
full fine-tuning (every weight with its gradient and AdamW state) and LoRA (hanlm.train.lora:
PEFT's adapters on sft.lora's target modules, rank 16, the chat tokens' rows trained, the
rest frozen). A step is hanlm's: forward through CausalLMWithLoss with the chunked loss,
backward, fused AdamW over the trainable parameters (hanlm.train.optim), in fp32 by default
(the CPU's), or with `--precision bf16` under bf16 autocast as `precision.mode = "bf16"` trains:
float32 masters for what trains, and with LoRA the blocks' frozen linear layers held in bf16
(hanlm.train.lora.hold_frozen_linears); its step time measures the CPU's bf16 kernels, its
memory what bf16 holds. Then `hanlm plan`'s SFT lines for the field's 1.3b model on one RTX 5090,
and the planner's figures at 125m beside the measured ones.

    python benchmarks/lora.py            # 125m, seq 512, micro-batch 4, 6 steps each
    python benchmarks/lora.py --precision bf16
    python benchmarks/lora.py --smoke    # tiny preset, 3 steps (the tests run it)

Memory: each variant runs in a fresh process (MALLOC_MMAP_THRESHOLD_ as in
benchmarks/loss_memory.py, so the resident set follows the tensors alive); its peak resident set
(VmHWM) minus the resident set before the model is built: the model, the optimizer, the
activations and the loss. Step time: the median of the steps after the first (which allocates
AdamW's states).
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]
CHAT_ROWS = (4, 5, 6, 7)  # four token ids standing for the chat template's rows


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(args) -> None:
    """One variant in this process: its peak memory and step times to `args.out`."""
    import torch

    from hanlm import model as model_lib
    from hanlm.config import SftLoraSection
    from hanlm.train import lora, optim, precision
    from hanlm.train.loss import CausalLMWithLoss, TokenLoss

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    before = _status_kib("VmRSS") * 1024
    config = model_lib.model_config(args.preset, vocab_size=args.vocab, seq_len=args.seq_len)
    model = model_lib.build_model(config, device="cpu").train()
    numerics = precision.resolve(args.precision, "cpu")
    if args.variant == "lora":
        _, model = lora.Adapters(SftLoraSection(rank=args.rank), CHAT_ROWS).inject(model)
        lora.hold_frozen_linears(model, numerics.compute_dtype)
    trained, total = lora.trainable_counts(model)
    root = CausalLMWithLoss(model)
    optimizer = optim.adamw(
        model, lr=1e-4, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, device="cpu"
    )
    loss = TokenLoss()
    ids = torch.randint(8, args.vocab, (args.micro_batch, args.seq_len + 1))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        with numerics.autocast_context("cpu"):
            sums = root(labels=labels, loss_fn=loss.sums, input_ids=inputs)
        (sums["loss"] / labels.numel()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    peak = _status_kib("VmHWM") * 1024 - before
    out = {"trained": trained, "total": total, "peak_bytes": peak, "step_s": times}
    Path(args.out).write_text(json.dumps(out))


def _run_variant(variant: str, args, folder: Path) -> dict:
    out = folder / f"{variant}.json"
    cmd = [sys.executable, __file__, "--worker", variant, "--out", str(out)]
    for key in (
        "preset",
        "vocab",
        "seq_len",
        "micro_batch",
        "steps",
        "rank",
        "threads",
        "precision",
    ):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024), "PYTHONWARNINGS": "ignore"}
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def _planner_lines(args) -> list[dict]:
    """`hanlm plan`'s SFT memory for the field's model on one RTX 5090, and for this run's
    setup on the CPU."""
    from hanlm.config import load_config
    from hanlm.plan.recipe import setup_from_config, sft_memory

    rows = []
    for recipe, gpu, values in (
        ("ko-1.3b-8x5090", "rtx5090", {"sft.micro_batch": 1, "sft.batch_rows": 64}),
        (
            None,
            "cpu",
            {
                "model.preset": args.preset,
                "tokenizer.vocab_size": args.vocab,
                "sft.seq_len": args.seq_len,
                "sft.micro_batch": args.micro_batch,
                "sft.batch_rows": args.micro_batch,
                "sft.lora.rank": args.rank,
                "precision.mode": args.precision,
            },
        ),
    ):
        cfg = load_config(recipe, values={**values, "plan.gpu": gpu, "plan.gpus": 1, "plan.hosts": 1,
                                          "parallel.mode": "single"})  # fmt: skip
        setup = setup_from_config(cfg, with_data=False)
        sft = sft_memory(cfg, setup)
        rows.append({"recipe": recipe or "this run", "gpu": gpu, **sft})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny preset, 3 steps")
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--worker", choices=("full", "lora"), dest="variant")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.variant:
        worker(args)
        return
    if args.smoke:
        args.preset, args.vocab, args.seq_len, args.micro_batch, args.steps = (
            "tiny", 512, 64, 2, 3
        )  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        results = {v: _run_variant(v, args, Path(folder)) for v in ("full", "lora")}
    print(
        f"SFT step at preset {args.preset} (vocab {args.vocab:,}), seq {args.seq_len} x "
        f"micro-batch {args.micro_batch}, {args.precision} on the CPU ({args.threads} threads), "
        f"{args.steps} steps each:"
    )
    for variant, result in results.items():
        step = statistics.median(result["step_s"][1:])
        print(
            f"  {variant:<5} trained {result['trained']:>12,} of {result['total']:,} parameters; "
            f"peak memory {result['peak_bytes'] / GIB:6.2f} GiB; step {step:6.2f} s"
        )
    full, low = results["full"], results["lora"]
    memory_ratio = low["peak_bytes"] / full["peak_bytes"]
    time_ratio = statistics.median(low["step_s"][1:]) / statistics.median(full["step_s"][1:])
    print(f"  lora / full: peak memory {memory_ratio:.2f}x, step time {time_ratio:.2f}x")
    for row in _planner_lines(args):
        full_plan, lora_plan = row["full"], row["lora"]
        print(
            f"plan ({row['recipe']}, one {row['gpu']}, SFT seq {row['seq_len']} x micro-batch "
            f"{row['micro_batch']}): full {full_plan['total'] / GIB:.2f} GiB, LoRA "
            f"r{row['lora_rank']} {lora_plan['total'] / GIB:.2f} GiB"
            + ("" if "fits" not in lora_plan else
               f" (full {'fits' if full_plan['fits'] else 'does not fit'}, LoRA "
               f"{'fits' if lora_plan['fits'] else 'does not fit'})")
        )  # fmt: skip


if __name__ == "__main__":
    main()
