"""Peak memory of the loss: the full float32 logits (the old path) against hanlm's chunked loss.

The loss part of a training step, forward and backward, from the final hidden states
[micro-batch, seq, hidden] and the output head [vocab, hidden]: the old path made the logits
under bf16 autocast, upcast them all to float32 and took the token-summed cross-entropy; the
chunked one (hanlm.train.loss) makes the logits of `--chunk-tokens` tokens at a time. Both give
the same loss and the same gradients of the hidden states and the head; the script says by how
much they differ and fails when the loss differs by more than 1e-4 relative.

    python benchmarks/loss_memory.py             # vocab 65,536 x seq 2,048 x micro-batch 8
    python benchmarks/loss_memory.py --smoke     # small, seconds (the tests run it)

How memory is measured: each variant runs in its own fresh process. Once its inputs exist, the
process's peak resident set (VmHWM) is reset to the current resident set by writing 5 to
/proc/self/clear_refs; the loss runs forward and backward; the peak minus the resident set at
the reset is the loss's peak. PyTorch's CPU allocator takes tensors from glibc's malloc, which
is told (MALLOC_MMAP_THRESHOLD_=65536) to map every block of 64 KiB or more from the OS and give
it back when freed, so the resident set follows the tensors alive, temporaries included, not
what malloc's heap keeps after frees. (tracemalloc does not see torch's memory.)
Without /proc/self/clear_refs (not Linux), ru_maxrss is used, minus the resident set before
the loss: right as long as nothing before the loss peaked higher, which holds here.
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import resource
import subprocess
import tempfile
from pathlib import Path

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _start_peak() -> tuple[int, str]:
    """The resident bytes now, with the peak reset to them where the OS allows."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kib("VmRSS") * 1024, "VmHWM after clear_refs"
    except (OSError, TypeError):
        rss = _status_kib("VmRSS")
        if rss is None:  # no /proc: the whole process's peak
            return 0, "ru_maxrss of the process"
        return rss * 1024, "ru_maxrss minus RSS before"


def _peak_bytes() -> int:
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def worker(args) -> None:
    """One variant in this process: its loss, peak and gradients to `args.out`."""
    import torch
    import torch.nn.functional as F

    from hanlm.train.loss import IGNORE, TokenLoss

    torch.manual_seed(0)
    tokens = args.micro_batch * args.seq_len
    hidden = torch.randn(args.micro_batch, args.seq_len, args.hidden).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden) * 0.02).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len))
    labels[:, -1] = IGNORE  # the last position has no next token
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def full_logits(hidden, labels) -> torch.Tensor:  # the Trainer's loss before hanlm.train.loss
        with autocast:
            logits = F.linear(hidden, weight)
        return F.cross_entropy(
            logits.float().view(-1, logits.size(-1)),
            labels.view(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )

    def chunked(hidden, labels) -> torch.Tensor:
        with autocast:
            return TokenLoss(args.chunk_tokens).sums(hidden, weight, labels)["loss"]

    loss_of = {"full": full_logits, "chunked": chunked}[args.worker]
    # warm-up on a few tokens: the kernels' one-time set-up (oneDNN) is not the loss's memory
    few = hidden[:1, :8].detach().requires_grad_()
    loss_of(few, labels[:1, :8]).backward()
    weight.grad = None
    start, method = _start_peak()
    loss = loss_of(hidden, labels)
    loss.backward()
    peak = _peak_bytes() - start
    torch.save(
        {
            "loss": loss.item(),
            "peak": peak,
            "method": method,
            "tokens": tokens,
            "grad_hidden": hidden.grad,
            "grad_weight": weight.grad,
            "threads": torch.get_num_threads(),
            "torch": str(torch.__version__),
        },
        args.out,
    )


def _run_variant(name: str, args, folder: Path) -> dict:
    import torch

    out = folder / f"{name}.pt"
    cmd = [sys.executable, __file__, "--worker", name, "--out", str(out)]
    for key in ("vocab", "seq_len", "micro_batch", "hidden", "chunk_tokens", "precision"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # every block of 64 KiB or more mapped and unmapped on its own (glibc's threshold is
        # otherwise raised by each free, up to 32 MiB): the resident set follows the tensors alive
        "MALLOC_MMAP_THRESHOLD_": str(64 * 1024),
    }
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"the {name} variant failed:\n{result.stderr[-3000:]}")
    return torch.load(out, weights_only=True)


def _relative(got, expected) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256, help="kept small: the logits dominate")
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--smoke", action="store_true", help="small sizes, seconds")
    parser.add_argument("--worker", choices=("full", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:
        args.vocab, args.seq_len, args.micro_batch, args.hidden = 8192, 256, 4, 64
        args.chunk_tokens = 96  # does not divide the 1,024 tokens

    with tempfile.TemporaryDirectory() as tmp:
        full = _run_variant("full", args, Path(tmp))
        chunked = _run_variant("chunked", args, Path(tmp))
    loss_difference = abs(chunked["loss"] - full["loss"]) / abs(full["loss"])
    ratio = full["peak"] / max(chunked["peak"], 1)
    print(
        f"loss memory: vocab {args.vocab:,} x seq {args.seq_len:,} x micro-batch "
        f"{args.micro_batch} ({full['tokens']:,} tokens), hidden {args.hidden}, "
        f"{args.precision} head matmul; chunks of {args.chunk_tokens:,} tokens; torch "
        f"{full['torch']}, {full['threads']} CPU threads; peak = {full['method']}, per process"
    )
    print(
        f"full float32 logits (old): peak {full['peak'] / GIB:7.3f} GiB   loss {full['loss']:.6f}"
    )
    print(
        f"chunked (hanlm):           peak {chunked['peak'] / GIB:7.3f} GiB   loss {chunked['loss']:.6f}"
    )
    print(
        f"ratio old / chunked = {ratio:.1f}x (target >= 4); loss relative difference "
        f"{loss_difference:.1e}; gradients' largest difference relative to their largest entry: "
        f"hidden {_relative(chunked['grad_hidden'], full['grad_hidden']):.1e}, head "
        f"{_relative(chunked['grad_weight'], full['grad_weight']):.1e}"
    )
    print(
        json.dumps(
            {
                "peak_full": full["peak"],
                "peak_chunked": chunked["peak"],
                "ratio": ratio,
                "loss_relative_difference": loss_difference,
            }
        )
    )
    if loss_difference > 1e-4:
        sys.exit("the chunked loss differs from the full one")


if __name__ == "__main__":
    main()
