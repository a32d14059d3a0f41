"""Host memory of building a model for FSDP2: whole on every rank then sharded, against built on
the meta device and initialised shard by shard (what `hanlm pretrain` does under FSDP).

Each way runs in fresh processes under torchrun (2 gloo ranks on CPU), so each rank's peak RSS
is that build's alone. Printed per way: the rank's peak RSS above what it held before building
(torch, transformers, the process group), its RSS after, the time, and the eager/meta ratio of
the peaks. Both ways give the same weights (tests/integration/test_model_init.py checks it bit for bit).
Expected: eager peaks near the whole fp32 model, meta near one shard plus the largest parameter.

With --sft, the same for SFT's start from a pretrained model (saved first, as a Hugging Face
folder and as a pretraining checkpoint): everything `hanlm sft` does on a rank before its first
step (the special-token audit, loading and placing the model, initialising the new chat-token
rows). *whole* is what it did before: each rank loads the whole model for the audit and again
to shard it; *parts* is what it does now (hanlm.train.pretrained): the audit reads the token
matrices alone, and the model built on meta is sharded and then filled, each rank reading only
its rows.

    python benchmarks/init_memory.py [--preset 125m] [--vocab 32000] [--ranks 2] [--sft]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`: keep this folder off
# the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import gc
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


def _write_result(path: Path, rank: int, model, before: int, seconds: float) -> None:
    """One rank's figures: peak and final RSS above `before`, and the sizes they compare with."""
    gc.collect()
    params = list(model.parameters())
    result = {
        "rank": rank,
        "peak_above_start_mb": (peak_rss() - before) / MB,
        "after_above_start_mb": (current_rss() - before) / MB,
        "seconds": seconds,
        "local_params_mb": sum(p.to_local().numel() * p.element_size() for p in params) / MB,
        "largest_param_mb": max(p.numel() * p.element_size() for p in params) / MB,
        "model_mb": sum(p.numel() * p.element_size() for p in params) / MB,
        "params": sum(p.numel() for p in params),
    }
    path.write_text(json.dumps(result))


def worker(way: str, preset: str, vocab: int, out: Path) -> None:
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
    _write_result(out / f"{way}-{d.rank}.json", d.rank, model, before, seconds)
    del model
    torch.distributed.barrier()
    parallel.shutdown(d)


# --- SFT's start -------------------------------------------------------------------------------

SFT_WAYS = ("whole", "parts")
SFT_SOURCES = ("hf", "checkpoint")


def _special(vocab: int) -> dict:
    """Chat tokens at the top of the vocabulary, as a hanlm tokenizer reserves them."""
    names = ("system", "user", "assistant", "eot", "pad", "eod", "bos")
    special = {n: {"id": vocab - 1 - i, "token": f"<|{n}|>"} for i, n in enumerate(names)}
    special["reserved"] = [{"id": vocab - 20 - i, "token": f"<|r{i}|>"} for i in range(8)]
    return special


def save_sources(preset: str, vocab: int, folder: Path) -> None:
    """The pretrained model SFT starts from, as `hanlm export` and the pretraining write it."""
    import torch.distributed.checkpoint as dcp

    from hanlm import model as model_lib
    from hanlm.train import checkpoint_layout, export

    config = model_lib.model_config(preset, vocab_size=vocab, seq_len=2048)
    model = model_lib.build_model(config, seed=0)
    model.save_pretrained(folder / "hf", safe_serialization=True)
    export._portable_model_config(folder / "hf" / "config.json", "float32")
    dcp.save({"model": dict(model.state_dict())}, checkpoint_id=str(folder / "ckpt"), no_dist=True)
    checkpoint_layout.write_manifest(folder / "ckpt")


def sft_worker(way: str, source_kind: str, preset: str, vocab: int, out: Path) -> None:
    import torch

    from hanlm import model as model_lib
    from hanlm.chat import tokens
    from hanlm.config import Config
    from hanlm.train import parallel, precision, pretrained, sft
    from hanlm.train.results import TokenAudit

    d = parallel.init("cpu")
    config = model_lib.model_config(preset, vocab_size=vocab, seq_len=2048)
    path = out / ("hf" if source_kind == "hf" else "ckpt")
    source = sft.SftSource(
        kind=source_kind,
        path=path,
        tokenizer_dir=path,
        fingerprint="",
        model_config=config if source_kind == "checkpoint" else None,
    )
    cfg = Config.model_validate({"parallel": {"device": "cpu"}, "sft": {"packing": False}})
    numerics = precision.resolve("fp32", d.device)
    special = _special(vocab)
    gc.collect()
    before = current_rss()
    start = time.perf_counter()
    # the rows a model pretrained without chat tokens has untrained (the audit's verdict)
    untrained = TokenAudit.model_construct(untrained_template_tokens=list(tokens.TEMPLATE_TOKENS))
    if way == "whole":  # before: the whole model for the audit, and again to shard it
        whole, _ = sft.load_source_model(source)
        tokens.audit(whole, special, None)
        del whole
        gc.collect()
        whole, _ = sft.load_source_model(source)
        ids = [special[n]["id"] for n in untrained.untrained_template_tokens]
        tokens.initialise(whole, ids, "mean", special)
        shell = model_lib.build_model(config, device="meta")
        loaded = dict(whole.named_parameters())

        def fill(model) -> None:  # each rank cuts its shards from its whole copy
            for name, param in model.named_parameters():
                parallel.write_full_value(param, loaded[name])

        model = parallel.parallelize_loaded(shell, d, "fsdp", fill=fill)
    else:  # now: the audit reads the token matrices, the shards are read by parts
        on_meta, problem = sft.model_on_meta(source)
        assert problem is None, problem
        tokens.audit(
            pretrained.with_token_matrices(on_meta, source.kind, source.path), special, None
        )
        del on_meta
        model, _, _ = sft._placed_model(cfg, source, numerics, d, "fsdp")
        sft.initialise_rows(cfg, model, source, untrained, special, "mean")
    seconds = time.perf_counter() - start
    model = parallel.unwrap(model)
    _write_result(out / f"{way}-{source_kind}-{d.rank}.json", d.rank, model, before, seconds)
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
    if args.sft:
        cmd += ["--sft", "--source", args.source]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode:
        sys.exit(f"{way} failed:\n{result.stderr[-3000:]}")
    name = f"{way}-{args.source}" if args.sft else way
    return [json.loads((out / f"{name}-{r}.json").read_text()) for r in range(args.ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sft", action="store_true", help="SFT's start from a saved model")
    parser.add_argument("--worker", choices=("eager", "meta", *SFT_WAYS), help=argparse.SUPPRESS)
    parser.add_argument("--source", choices=SFT_SOURCES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker and args.sft:
        sft_worker(args.worker, args.source, args.preset, args.vocab, args.out)
        return
    if args.worker:
        worker(args.worker, args.preset, args.vocab, args.out)
        return
    if args.sft:
        sft_main(args)
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


def sft_main(args) -> None:
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_sources(args.preset, args.vocab, Path(tmp))
        for source in SFT_SOURCES:
            args.source = source
            for way in SFT_WAYS:
                runs[(source, way)] = launch(way, args, Path(tmp))
    first = runs[("hf", "parts")][0]
    print(
        f"SFT's start, {args.preset} at vocab {args.vocab:,}: {first['params']:,} parameters, "
        f"{first['model_mb']:.0f} MB in fp32; {args.ranks} ranks; largest parameter "
        f"{first['largest_param_mb']:.0f} MB; one rank's shards {first['local_params_mb']:.0f} MB"
    )
    print(
        f"{'source':<11} {'way':<6} {'rank':>4} {'peak RSS +MB':>13} {'RSS after +MB':>14} {'s':>6}"
    )
    for (source, way), ranks in runs.items():
        for r in ranks:
            print(
                f"{source:<11} {way:<6} {r['rank']:>4} {r['peak_above_start_mb']:>13.0f} "
                f"{r['after_above_start_mb']:>14.0f} {r['seconds']:>6.1f}"
            )
    for source in SFT_SOURCES:
        whole = max(r["peak_above_start_mb"] for r in runs[(source, "whole")])
        parts = max(r["peak_above_start_mb"] for r in runs[(source, "parts")])
        print(f"{source}: peak RSS per rank, whole / parts: {whole / parts:.2f}x "
              f"({whole:.0f} MB / {parts:.0f} MB)")  # fmt: skip


if __name__ == "__main__":
    main()
