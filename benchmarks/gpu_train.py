"""Tokens/s, MFU and peak memory of hanlm's pretraining on this machine's GPU, bf16 against FP8.

Trains the `350m` and `1.3b` presets at sequence 2,048 and vocabulary 65,536 (the field recipe,
hanlm/configs/ko-1.3b-8x5090.toml) for a fixed number of steps, in bf16 and in FP8, with every
decoder block compiled (`parallel.compile`). Each configuration runs in a fresh process (under
torchrun with --nproc > 1) through `hanlm.train.pretrain.pretrain` itself: model build, precision
plan, FP8 conversion, parallelisation with compile, the Trainer's step and its loader, on shards
of random tokens. Per configuration it prints the steady-state tokens/s (log windows after the
first, which holds the warm-up and the compile), MFU against the catalogue peak, the peak memory
measured against `hanlm plan`'s prediction for the same setup, and per preset FP8/bf16 tokens/s.

    python benchmarks/gpu_train.py                   # one GPU, all four configurations, < 8 min
    python benchmarks/gpu_train.py --nproc 8         # FSDP2 over this host's 8 GPUs
    python benchmarks/gpu_train.py --smoke           # CPU, tiny preset, seconds: the tests run it
    python benchmarks/gpu_train.py --presets 1.3b --precisions bf16 --optimizers adamw,muon

Targets (issue 18) on an H100/H200-class GPU: 1.3b bf16 >= 45% MFU; FP8 with compile >= 1.2x
bf16 tokens/s at 1.3b; measured peak memory within 10% of the plan.
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
import math
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hanlm.errors import UserError

GIB = 1 << 30
PRESETS = ("1.3b", "350m")  # the judged one first: the time guard skips from the end
PRECISIONS = ("bf16", "fp8")
AUTO_MICRO_BATCHES = (16, 8, 4, 2, 1)  # tried largest first
FIT_SHARE = 0.85  # an automatic micro-batch's planned memory leaves 15% of the device free
TARGETS = {"mfu_1.3b_bf16": 0.45, "fp8_over_bf16_1.3b": 1.2, "memory_vs_plan": 0.10}
TARGET_GPUS = ("h100", "h200")


def _sibling(name: str):
    """A module of this folder, loaded by path (the folder is off the import path)."""
    spec = importlib.util.spec_from_file_location(f"hanlm_bench_{name}", f"{_HERE}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Run:
    """One configuration: what a worker process trains."""

    preset: str
    precision: str
    optimizer: str  # adamw, or muon (hanlm.train.muon)
    compile_blocks: bool
    micro_batch: int | None  # None: the largest the plan fits on the device
    seq_len: int
    vocab_size: int
    warmup_steps: int  # the first log window: the compile happens here
    timed_steps: int  # a multiple of warmup_steps: whole log windows
    activation_checkpointing: str
    parallel: str
    device: str
    nproc: int
    shards: str
    folder: str

    @property
    def name(self) -> str:
        muon = " muon" if self.optimizer == "muon" else ""
        return f"{self.preset} {self.precision}{' compiled' if self.compile_blocks else ''}{muon}"


# --- the worker: one configuration, in its own process (every rank under torchrun) ----------


def _device_facts(device: str, local_rank: int) -> dict[str, Any]:
    """The catalogue key of this rank's device (None when the catalogue lacks it), its name and
    its memory."""
    import torch

    from hanlm.plan.catalogue import find

    if device == "cpu":
        from hanlm.plan.memory_model import capacity_bytes

        return {"name": "CPU", "gpu": "cpu", "capacity": capacity_bytes("cpu")}
    props = torch.cuda.get_device_properties(local_rank)
    try:
        key = find(props.name).key
    except UserError:
        key = None
    return {
        "name": props.name,
        "gpu": key,
        "capacity": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
    }


def _recipe(sp, run: Run, micro_batch: int, world: int):
    return sp.recipe(
        preset=run.preset,
        vocab_size=run.vocab_size,
        seq_len=run.seq_len,
        micro_batch=micro_batch,
        world_size=world,
        total_steps=run.warmup_steps + run.timed_steps + 1,  # stopped one short: no final save
        precision=run.precision,
        compile_blocks=run.compile_blocks,
        activation_checkpointing=run.activation_checkpointing,
        parallel=run.parallel,
        device=run.device,
        log_every=run.warmup_steps,
        optimizer=run.optimizer,
    )


def _fitting_micro_batch(sp, run: Run, facts: dict, world: int) -> tuple[int | None, dict]:
    """The largest micro-batch whose planned memory fits FIT_SHARE of the device, and its plan."""
    plan: dict = {}
    for micro_batch in AUTO_MICRO_BATCHES:
        plan = sp.planned_memory(
            _recipe(sp, run, micro_batch, world), gpu=facts["gpu"], world_size=world
        )
        if plan["total"] <= FIT_SHARE * facts["capacity"]:
            return micro_batch, plan
    return None, plan


def _measured_memory(device: str, local_rank: int, sp) -> dict[str, int]:
    import torch

    if device == "cpu":
        return {"rss": sp.peak_rss_bytes()}
    torch.cuda.synchronize(local_rank)
    free, total = torch.cuda.mem_get_info(local_rank)
    reserved = torch.cuda.memory_reserved(local_rank)
    # the CUDA context, cuBLAS/NCCL workspaces and kernels: held outside the caching allocator
    # (counted after training; the allocator still holds what it reserved)
    outside = max(0, (total - free) - reserved)
    peak_reserved = torch.cuda.max_memory_reserved(local_rank)
    return {
        "allocated": torch.cuda.max_memory_allocated(local_rank),
        "reserved": peak_reserved,
        "outside_allocator": outside,
        "device": peak_reserved + outside,
    }


def _throughput(
    sp, run: Run, records: list[dict], facts: dict, world: int, local_rank: int
) -> dict:
    import torch

    from hanlm import model as model_lib
    from hanlm.plan.catalogue import device_peak_flops

    device = torch.device(run.device, local_rank) if run.device == "cuda" else torch.device("cpu")
    config = model_lib.model_config(run.preset, vocab_size=run.vocab_size, seq_len=run.seq_len)
    flops = model_lib.flops_per_token(config, run.seq_len)
    peak, source = device_peak_flops(device, run.precision)
    bf16_peak, _ = device_peak_flops(device, "bf16")
    steady = sp.steady_state(records, skip_windows=1)
    tps = steady["tokens_per_s"]
    return {
        **steady,
        "flops_per_token": flops["total"],
        "peak_flops": peak,
        "peak_source": source,
        "mfu": tps * flops["total"] / (peak * world),
        "mfu_of_bf16_peak": tps * flops["total"] / (bf16_peak * world),
        "windows": [
            {k: r.get(k) for k in ("step", "loss", "tokens_per_s", "peak_memory_gb")}
            for r in records
        ],
    }


def _compile_stats() -> dict[str, Any]:
    """What torch.compile did in this process: graphs made, and whether a function hit dynamo's
    recompile limit (after which it runs eagerly: some blocks would then not be compiled)."""
    from torch._dynamo.utils import counters

    seen = {group: dict(values) for group, values in counters.items()}
    return {
        "unique_graphs": seen.get("stats", {}).get("unique_graphs", 0),
        "frames": seen.get("frames", {}),
        "graph_breaks": sum(seen.get("graph_break", {}).values()),
        "recompile_limit_hit": "recompile limit" in json.dumps(seen, default=str).lower(),
    }


def worker(spec_file: Path) -> None:
    """Train one configuration and write this rank's result next to the spec."""
    import torch

    sp = _sibling("synthetic_pretrain")
    run = Run(**json.loads(spec_file.read_text(encoding="utf-8")))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    facts = _device_facts(run.device, local_rank)
    result: dict[str, Any] = {"rank": rank, "world_size": world, "device": facts}
    if run.micro_batch is None:
        micro_batch, plan = _fitting_micro_batch(sp, run, facts, world)
    else:
        micro_batch = run.micro_batch
        plan = sp.planned_memory(
            _recipe(sp, run, micro_batch, world), gpu=facts["gpu"], world_size=world
        )
    result.update(micro_batch=micro_batch, plan=plan)
    folder = Path(run.folder)
    try:
        if micro_batch is None:
            raise UserError(
                f"the plan fits no micro-batch of {run.preset} in {FIT_SHARE:.0%} of "
                f"{facts['capacity'] / GIB:.1f} GiB (micro-batch 1: {plan['total'] / GIB:.1f} GiB)",
                fix="use more GPUs (--nproc) or --activation-checkpointing full",
            )
        cfg = _recipe(sp, run, micro_batch, world)
        sp.train(cfg, Path(run.shards), folder, stop_after_steps=run.warmup_steps + run.timed_steps)
    except UserError as e:  # the device cannot run it (FP8 before Ada, say): skipped, with why
        result["skipped"] = e.message
    except torch.OutOfMemoryError as e:
        result["failed"] = f"out of memory at micro-batch {micro_batch}: {str(e).splitlines()[0]}"
        result["measured"] = _measured_memory(run.device, local_rank, sp)
    else:
        result["measured"] = _measured_memory(run.device, local_rank, sp)
        if run.compile_blocks:
            result["compile"] = _compile_stats()
        if rank == 0:
            records = sp.read_metrics(sp.outputs(folder).metrics)
            result["throughput"] = _throughput(sp, run, records, facts, world, local_rank)
    out = folder / f"result.rank{rank}.json"
    out.with_suffix(".tmp").write_text(json.dumps(result, indent=1), encoding="utf-8")
    out.with_suffix(".tmp").replace(out)


# --- the driver: configurations one after another, within the time limit -------------------


def _launch(run: Run, spec_file: Path, log: Path, timeout_s: float) -> tuple[int | None, float]:
    """Run the worker (under torchrun for several ranks); (exit code or None if stopped at the
    time limit, seconds)."""
    script = [os.path.abspath(__file__), "--worker", str(spec_file)]
    if run.nproc > 1:
        launcher = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(run.nproc),
        ]
        cmd = [sys.executable, *launcher, *script]
    else:
        cmd = [sys.executable, *script]
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        # a session of its own: at the time limit torchrun and its ranks are stopped together
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    return code, time.perf_counter() - start


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _row(run: Run, folder: Path, code: int | None, seconds: float, log: Path) -> dict[str, Any]:
    """One configuration's figures, from its ranks' result files."""
    row: dict[str, Any] = {
        "config": run.name,
        "run": asdict(run),
        "elapsed_s": seconds,
        "log": str(log),
    }
    ranks = [
        json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("result.rank*.json"))
    ]
    if code is None:
        row["status"] = "stopped at the --max-minutes limit"
        return row
    if code != 0 or not ranks:
        row["status"] = f"failed (exit {code}); the end of {log}:\n{_tail(log)}"
        return row
    first = ranks[0]
    row.update(micro_batch=first["micro_batch"], device=first["device"], plan=first["plan"])
    for key in ("skipped", "failed"):
        if key in first:
            row["status"] = f"{key}: {first[key]}"
    if "measured" in first:
        # the worst rank: the plan is per rank and the card must hold the largest
        row["measured"] = {k: max(r["measured"][k] for r in ranks) for k in first["measured"]}
        measured = row["measured"].get("device", row["measured"].get("rss"))
        row["measured_bytes"] = measured
        row["memory_vs_plan"] = measured / first["plan"]["total"]
        if "allocated" in row["measured"]:
            allowance = first["plan"]["items"]["framework allowance"]
            row["allocated_vs_plan_without_allowance"] = row["measured"]["allocated"] / (
                first["plan"]["total"] - allowance
            )
    if "throughput" in first:
        row["throughput"] = first["throughput"]
    if "compile" in first:
        row["compile"] = first["compile"]
        if first["compile"]["recompile_limit_hit"]:
            row["warning"] = (
                "torch.compile hit its recompile limit: the blocks past it ran uncompiled "
                f"({first['compile']['unique_graphs']} graphs); rerun with TORCH_LOGS=recompiles"
            )
    row.setdefault("status", "ok")
    return row


def _ratios(rows: list[dict]) -> dict[str, float]:
    """FP8 over bf16 tokens/s per preset (AdamW), where both ran."""
    rate = {
        (r["run"]["preset"], r["run"]["precision"]): r["throughput"]["tokens_per_s"]
        for r in rows
        if r.get("status") == "ok" and r["run"]["optimizer"] == "adamw"
    }
    out = {}
    for (preset, precision), tps in rate.items():
        if precision.startswith("fp8") and (preset, "bf16") in rate:
            out[preset] = tps / rate[(preset, "bf16")]
    return out


def _muon_ratios(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Muon over AdamW per preset and precision, where both ran: tokens/s and peak memory."""
    ran = {
        (r["run"]["preset"], r["run"]["precision"], r["run"]["optimizer"]): r
        for r in rows
        if r.get("status") == "ok"
    }
    out = {}
    for (preset, precision, optimizer), r in ran.items():
        adamw = ran.get((preset, precision, "adamw"))
        if optimizer == "muon" and adamw is not None:
            out[f"{preset} {precision}"] = {
                "tokens_per_s": r["throughput"]["tokens_per_s"]
                / adamw["throughput"]["tokens_per_s"],
                "peak_memory": r["measured_bytes"] / adamw["measured_bytes"],
            }
    return out


def _targets(rows: list[dict], ratios: dict[str, float]) -> list[dict] | None:
    """The issue's targets, checked when the GPU is H100/H200-class (None elsewhere)."""
    ran = [r for r in rows if r.get("status") == "ok"]
    if not ran or ran[0]["device"].get("gpu") not in TARGET_GPUS:
        return None
    checks = []
    for r in ran:
        if (r["run"]["preset"], r["run"]["precision"], r["run"]["optimizer"]) == (
            "1.3b", "bf16", "adamw"
        ):  # fmt: skip
            mfu = r["throughput"]["mfu"]
            checks.append({"target": "1.3b bf16 MFU >= 45%", "value": mfu, "met": mfu >= 0.45})
    if "1.3b" in ratios:
        ratio = ratios["1.3b"]
        checks.append(
            {"target": "1.3b FP8/bf16 tokens/s >= 1.2", "value": ratio, "met": ratio >= 1.2}
        )
    for r in ran:
        off = abs(r["memory_vs_plan"] - 1)
        checks.append(
            {
                "target": f"{r['config']}: peak memory within 10% of the plan",
                "value": r["memory_vs_plan"],
                "met": off <= 0.10,
            }
        )
    return checks


def _print_table(rows: list[dict], ratios: dict[str, float], header: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=header, title_justify="left")
    for column in (
        "config",
        "micro-batch",
        "tokens/s",
        "MFU",
        "peak memory",
        "plan",
        "measured/plan",
        "warm-up s",
        "elapsed s",
        "status",
    ):
        table.add_column(column, justify="left" if column in ("config", "status") else "right")
    for r in rows:
        t, ok = r.get("throughput"), r.get("status") == "ok"
        memory = r.get("measured_bytes")
        table.add_row(
            r["config"],
            str(r.get("micro_batch", "")),
            f"{t['tokens_per_s']:,.0f}" if ok and t else "",
            f"{t['mfu']:.1%}" if ok and t and math.isfinite(t["mfu"]) else "",
            f"{memory / GIB:.2f} GiB" if memory else "",
            f"{r['plan']['total'] / GIB:.2f} GiB" if "plan" in r else "",
            f"{r['memory_vs_plan']:.2f}x" if "memory_vs_plan" in r else "",
            f"{t['warmup_s']:.0f}" if ok and t else "",
            f"{r['elapsed_s']:.0f}",
            r["status"].splitlines()[0][:70] + (" (recompile limit hit)" if "warning" in r else ""),
        )
    console = Console(highlight=False, width=200)
    console.print(table)
    for preset, ratio in ratios.items():
        console.print(f"{preset}: FP8/bf16 tokens/s = {ratio:.2f}x")
    for setup, ratio in _muon_ratios(rows).items():
        console.print(
            f"{setup}: Muon/AdamW tokens/s = {ratio['tokens_per_s']:.2f}x, peak memory = "
            f"{ratio['peak_memory']:.2f}x"
        )


def _configs(args) -> list[tuple[str, str, str]]:
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    optimizers = [p.strip() for p in args.optimizers.split(",") if p.strip()]
    for optimizer in optimizers:
        if optimizer not in ("adamw", "muon"):
            raise UserError(
                f"unknown optimizer {optimizer!r}", where="--optimizers", fix="use adamw, muon"
            )
    from typing import get_args

    from hanlm.config import PrecisionSection
    from hanlm.model_presets import preset_names  # light: a bad flag is refused at once

    KNOWN = get_args(PrecisionSection.model_fields["mode"].annotation)

    for preset in presets:
        if preset not in preset_names():
            raise UserError(
                f"unknown preset {preset!r}",
                where="--presets",
                fix=f"use some of {', '.join(preset_names())}",
            )
    for precision in precisions:
        if precision not in KNOWN or precision == "fp4":
            raise UserError(
                f"unknown precision {precision!r}",
                where="--precisions",
                fix="use some of bf16, fp8, fp8-emulate, fp32",
            )
    if not presets or not precisions or not optimizers:
        raise UserError(
            "nothing to run",
            where="--presets/--precisions/--optimizers",
            fix="name at least one of each",
        )
    return [
        (preset, precision, optimizer)
        for preset in presets
        for precision in precisions
        for optimizer in optimizers
    ]


def _micro_batches(text: str) -> dict[str, int | None]:
    """--micro-batch: auto, N (every preset), or PRESET=N pairs (the others auto)."""
    out: dict[str, int | None] = {}
    try:
        if text == "auto":
            return out
        if "=" not in text:
            out["*"] = int(text)
        else:
            for pair in text.split(","):
                preset, value = pair.split("=")
                out[preset.strip()] = int(value)
    except ValueError:
        raise UserError(
            f"cannot read --micro-batch {text!r}", fix="give auto, N, or PRESET=N[,PRESET=N]"
        ) from None
    if any(v < 1 for v in out.values()):
        raise UserError(
            f"--micro-batch {text!r} must be at least 1", fix="give auto or a positive N"
        )
    return out


# What a GPU run trains by default, and what --smoke trains instead on a CPU in seconds; a flag
# given on the command line wins over both.
DEFAULTS = {
    "presets": ",".join(PRESETS),
    "precisions": ",".join(PRECISIONS),
    "optimizers": "adamw",
    "compile": "all",
    "seq_len": 2048,
    "vocab": 65536,
    "micro_batch": "auto",
    "warmup_steps": 5,
    "steps": 20,
}
SMOKE_DEFAULTS = {
    "presets": "tiny",
    "precisions": "bf16,fp8-emulate",
    "optimizers": "adamw",
    "compile": "none",
    "seq_len": 64,
    "vocab": 512,
    "micro_batch": "2",
    "warmup_steps": 1,
    "steps": 2,
}


def _parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])

    def option(flag: str, help: str, **kwargs) -> None:
        key = flag[2:].replace("-", "_")
        shown = f"{DEFAULTS[key]}; --smoke: {SMOKE_DEFAULTS[key]}"
        parser.add_argument(flag, default=None, help=f"{help} (default {shown})", **kwargs)

    option("--presets", "comma-separated presets")
    option("--precisions", "comma-separated: bf16, fp8, fp8-emulate (CPU), fp32")
    option("--optimizers", "comma-separated: adamw, muon (Muon on the blocks' matrices)")
    option("--compile", "which configurations compile each block", choices=("all", "fp8", "none"))
    option("--seq-len", "tokens per sequence", type=int)
    option("--vocab", "vocabulary size", type=int)
    option(
        "--micro-batch",
        f"auto (the largest of {AUTO_MICRO_BATCHES} whose planned memory fits "
        f"{FIT_SHARE:.0%} of the device), N, or PRESET=N,...",
    )
    option(
        "--warmup-steps", "steps before the timed ones (the first log window: compile)", type=int
    )
    option("--steps", "timed steps, rounded up to whole windows of --warmup-steps", type=int)
    parser.add_argument(
        "--activation-checkpointing",
        choices=("none", "selective", "full"),
        default="none",
        help="the recipe's: none",
    )
    parser.add_argument(
        "--nproc", type=int, default=1, help="GPUs of this host (torchrun); several: --parallel"
    )
    parser.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=8.0,
        help="configurations not started by then are skipped, a running one is stopped",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("gpu_train.json"),
        help="the figures as JSON (each configuration's log in OUT-logs/ beside it)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="CPU: tiny preset, bf16 and fp8-emulate, few steps"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in (SMOKE_DEFAULTS if args.smoke else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ("seq_len", "vocab", "warmup_steps", "steps", "nproc"):
        if getattr(args, name) < 1:
            raise UserError(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
            )
    if args.max_minutes < 0:
        raise UserError(f"--max-minutes must be positive, got {args.max_minutes}")
    return args


def drive(args) -> dict[str, Any]:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(
            "gpu_train.py starts its own ranks", fix="run it with python, and --nproc N for N GPUs"
        )
    micro = _micro_batches(args.micro_batch)
    configs = _configs(args)
    import torch

    sp = _sibling("synthetic_pretrain")
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and torch.cuda.device_count() < args.nproc:
        found = torch.cuda.device_count()
        raise UserError(
            f"--nproc {args.nproc} needs as many CUDA GPUs; this machine has {found}",
            fix="run it on a GPU host (or --smoke on a CPU)"
            if not found
            else f"use --nproc {found} or fewer",
        )
    window = args.warmup_steps
    timed = math.ceil(args.steps / window) * window
    work = args.out.with_name(args.out.stem + "-logs")
    work.mkdir(parents=True, exist_ok=True)
    # enough random tokens for the largest micro-batch: every sample is seen once
    auto = any(micro.get(preset, micro.get("*")) is None for preset, _, _ in configs)
    largest = max([*micro.values(), *(AUTO_MICRO_BATCHES if auto else ())])
    shards = sp.write_random_shards(
        work / "shards",
        vocab_size=args.vocab,
        tokens=(window + timed + 2) * largest * args.nproc * args.seq_len + 1,
    )
    started, rows = time.perf_counter(), []
    for i, (preset, precision, optimizer) in enumerate(configs):
        compiled = args.compile == "all" or (args.compile == "fp8" and precision.startswith("fp8"))
        folder = work / f"{i}-{preset}-{precision}-{optimizer}"
        run = Run(
            preset=preset,
            precision=precision,
            optimizer=optimizer,
            compile_blocks=compiled,
            micro_batch=micro.get(preset, micro.get("*")),
            seq_len=args.seq_len,
            vocab_size=args.vocab,
            warmup_steps=window,
            timed_steps=timed,
            activation_checkpointing=args.activation_checkpointing,
            parallel=args.parallel if args.nproc > 1 else "single",
            device=device,
            nproc=args.nproc,
            shards=str(shards),
            folder=str(folder),
        )
        left_s = args.max_minutes * 60 - (time.perf_counter() - started)
        if left_s <= 0:
            rows.append(
                {
                    "config": run.name,
                    "run": asdict(run),
                    "elapsed_s": 0.0,
                    "status": "skipped: --max-minutes reached",
                }
            )
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("result.rank*.json"):
            stale.unlink()
        spec = folder / "spec.json"
        spec.write_text(json.dumps(asdict(run)), encoding="utf-8")
        print(
            f"[{i + 1}/{len(configs)}] {run.name}: running ({left_s / 60:.1f} min left)", flush=True
        )
        code, seconds = _launch(run, spec, folder / "log.txt", left_s)
        row = _row(run, folder, code, seconds, folder / "log.txt")
        rows.append(row)
        print(f"[{i + 1}/{len(configs)}] {_summary(row)}", flush=True)
    ratios = _ratios(rows)
    return {
        "benchmark": "gpu_train",
        "torch": torch.__version__,
        "torchao": _version("torchao"),
        "transformers": _version("transformers"),
        "nproc": args.nproc,
        "seq_len": args.seq_len,
        "vocab": args.vocab,
        "warmup_steps": window,
        "timed_steps": timed,
        "total_s": time.perf_counter() - started,
        "configs": rows,
        "fp8_over_bf16": ratios,
        "muon_over_adamw": _muon_ratios(rows),
        "targets": _targets(rows, ratios),
    }


def _summary(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['config']}: {row['status']} ({row['elapsed_s']:.0f} s)"
    t = row["throughput"]
    warning = f"\n  warning: {row['warning']}" if "warning" in row else ""
    return (
        f"{row['config']}: micro-batch {row['micro_batch']}, {t['tokens_per_s']:,.0f} tokens/s, "
        f"MFU {t['mfu']:.1%} ({t['peak_source']}), peak memory {row['measured_bytes'] / GIB:.2f} GiB "
        f"against {row['plan']['total'] / GIB:.2f} GiB planned ({row['memory_vs_plan']:.2f}x); "
        f"warm-up {t['warmup_s']:.0f} s, {row['elapsed_s']:.0f} s in all{warning}"
    )


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(argv)
        if args.worker is not None:
            worker(args.worker)
            return 0
        report = drive(args)
    except UserError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    rows = report["configs"]
    device = next((r["device"]["name"] for r in rows if "device" in r), "no device")
    header = (
        f"hanlm pretraining on {report['nproc']} x {device}, seq {report['seq_len']}, vocab "
        f"{report['vocab']:,}; {report['timed_steps']} timed steps after {report['warmup_steps']} "
        f"warm-up; torch {report['torch']}, torchao {report['torchao']}"
    )
    _print_table(rows, report["fp8_over_bf16"], header)
    for check in report["targets"] or []:
        print(f"{'meets' if check['met'] else 'MISSES'}: {check['target']} ({check['value']:.3g})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"written to {args.out}")
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
