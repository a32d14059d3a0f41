"""Host memory of building a model for FSDP2: whole on every rank then sharded, against built on
the meta device and initialised shard by shard (what `hanlm pretrain` does under FSDP).

Each way runs in fresh processes under torchrun (2 gloo ranks on CPU), so each rank's peak RSS
is that build's alone. Printed per way: the rank's peak RSS above what it held before building
(torch, transformers, the process group), its RSS after, the time, and the eager/meta ratio of
the peaks. Both ways give the same weights (tests/test_model_init.py checks it bit for bit).
Expected: eager peaks near the whole fp32 model, meta near one shard plus the largest parameter.

    python benchmarks/init_memory.py [--preset 125m] [--vocab 32000] [--ranks 2]
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
import time
from pathlib import Path

MB = 1024 * 1024


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker(way: str, preset: str, vocab: int, out: Path) -> None:
    import gc

    import torch

    from hanlm import model as model_lib
    from hanlm.config import Config
    from hanlm.train import parallel, precision, pretrain
    from hanlm.train.build import Placement

    d = parallel.init("cpu")
    mconfig = model_lib.model_config(preset, vocab_size=vocab, seq_len=2048)
    gc.collect()
    before = current_rss()
    start = time.perf_counter()
    if way == "eager":  # what pretrain did before: the whole model, then fully_shard
        model = model_lib.build_model(mconfig, seed=0, device=d.device)
        model = parallel.parallelize(model, d, "fsdp")
    else:
        cfg = Config.model_validate(
            {
                "model": {"preset": preset},
                "pretrain": {"seq_len": 2048},
                "parallel": {"device": "cpu"},
            }
        )
        at = Placement(d, "fsdp", precision.resolve("fp32", d.device))
        _, model, _ = pretrain._built_model(cfg, vocab, at)
    seconds = time.perf_counter() - start
    gc.collect()
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "rank": d.rank,
        "peak_above_start_mb": (peak_rss() - before) / MB,
        "after_above_start_mb": (current_rss() - before) / MB,
        "seconds": seconds,
        "local_params_mb": local / MB,
        "largest_param_mb": largest / MB,
        "model_mb": total / MB,
        "params": sum(p.numel() for p in model.parameters()),
    }
    (out / f"{way}-{d.rank}.json").write_text(json.dumps(result))
    del model
    torch.distributed.barrier()
    parallel.shutdown(d)


def launch(way: str, args, out: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc_per_node", str(args.ranks), __file__, "--worker", way]
    cmd += ["--preset", args.preset, "--vocab", str(args.vocab), "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode:
        sys.exit(f"{way} failed:\n{result.stderr[-3000:]}")
    return [json.loads((out / f"{way}-{r}.json").read_text()) for r in range(args.ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--worker", choices=("eager", "meta"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.preset, args.vocab, args.out)
        return

    with tempfile.TemporaryDirectory() as tmp:
        runs = {way: launch(way, args, Path(tmp)) for way in ("eager", "meta")}
    first = runs["meta"][0]
    print(
        f"{args.preset} at vocab {args.vocab:,}: {first['params']:,} parameters, "
        f"{first['model_mb']:.0f} MB in fp32; {args.ranks} ranks; largest parameter "
        f"{first['largest_param_mb']:.0f} MB; one rank's shards {first['local_params_mb']:.0f} MB"
    )
    print(f"{'way':<6} {'rank':>4} {'peak RSS +MB':>13} {'RSS after +MB':>14} {'build s':>8}")
    for way, ranks in runs.items():
        for r in ranks:
            print(
                f"{way:<6} {r['rank']:>4} {r['peak_above_start_mb']:>13.0f} "
                f"{r['after_above_start_mb']:>14.0f} {r['seconds']:>8.1f}"
            )
    eager = max(r["peak_above_start_mb"] for r in runs["eager"])
    meta = max(r["peak_above_start_mb"] for r in runs["meta"])
    print(f"peak RSS per rank, eager / meta: {eager / meta:.2f}x ({eager:.0f} MB / {meta:.0f} MB)")


if __name__ == "__main__":
    main()
