"""The real-size rehearsal on a CPU: the `350m` preset under FSDP2 on 2 gloo ranks trains 2 steps,
saves a checkpoint, resumes in new processes and trains a third; each rank's peak resident
memory is compared with what `hanlm plan` predicts for the same setup.

Every phase is `torchrun --nproc_per_node 2` over hanlm's own pretraining
(`hanlm.train.pretrain.pretrain`) on shards of random tokens. Each rank reports its peak RSS
(`ru_maxrss`) and, from a sampler thread, the largest RSS seen before the first step (model
build, sharding, optimizer, resume), during each step and after the last (the checkpoint), so
that a gap to the plan can be put on its term. With --check-exact a third run trains the 3
steps uninterrupted and its step-3 loss must equal the resumed one bit for bit.

    python benchmarks/rehearsal_350m.py [--seq-len 512] [--vocab 65536] [--check-exact]

A benchmark, not a test: ~13 minutes on 2 busy CPU cores (21 with --check-exact), ~9 GB of
checkpoints under --work while it runs (deleted at the end unless --keep-checkpoints). Figures:
benchmarks/README.md.
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
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from hanlm.errors import UserError
from hanlm.plan.memory_model import FRAGMENTATION

GIB = 1 << 30
STAGING_ITEM = "checkpoint staging (async save)"  # hanlm.plan.memory_model's, on a CPU
RANKS = 2
STEPS = 3  # 2 before the checkpoint, 1 after the resume
SAMPLE_S = 0.05


def _sibling(name: str):
    """A module of this folder, loaded by path (the folder is off the import path)."""
    spec = importlib.util.spec_from_file_location(f"hanlm_bench_{name}", f"{_HERE}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- a rank of one phase ----------------------------------------------------------------------


class RssWatch:
    """This process's resident memory, sampled by a thread: the largest value seen in each
    labelled segment of the run (ru_maxrss gives the exact peak, but not when it happened)."""

    def __init__(self):
        self.segment = "start"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.mark()
            time.sleep(SAMPLE_S)

    def mark(self) -> None:
        rss = self.rss()
        self.peaks[self.segment] = max(self.peaks.get(self.segment, 0), rss)

    def enter(self, segment: str) -> None:
        self.mark()  # the end of the segment before
        self.segment = segment
        self.mark()

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        self.mark()
        return self.peaks


def _watch_steps(watch: RssWatch) -> None:
    """Label the sampler's segments by the Trainer's steps (the Trainer is hanlm's, unchanged:
    its train_step is wrapped to mark where a step begins and ends)."""
    from hanlm.train.trainer import Trainer

    step = Trainer.train_step

    def watched(self):
        watch.enter(f"step {self.state.step + 1}")
        out = step(self)
        watch.enter(f"after step {self.state.step}")
        return out

    Trainer.train_step = watched


def worker(spec_file: Path) -> None:
    """One phase on this rank; writes its memory and timing next to the spec."""
    watch = RssWatch()
    sp = _sibling("synthetic_pretrain")
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))
    cfg = sp.recipe(**spec["recipe"])
    _watch_steps(watch)
    watch.enter("build, shard, optimizer, resume")
    start = time.perf_counter()
    summary = sp.train(
        cfg,
        Path(spec["shards"]),
        Path(spec["folder"]),
        stop_after_steps=spec["stop_after_steps"],
        fresh=spec["fresh"],
    )
    seconds = time.perf_counter() - start
    result = {
        "rank": rank,
        "peak_rss": sp.peak_rss_bytes(),
        "segments": watch.stop(),
        "seconds": seconds,
        "step": summary.step,
    }
    out = Path(spec["folder"]) / f"{spec['phase']}.rank{rank}.json"
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")


# --- the driver -------------------------------------------------------------------------------


def _phase(name: str, folder: Path, spec: dict, log: Path) -> tuple[list[dict], float]:
    spec_file = folder / f"{name}.spec.json"
    folder.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(
        json.dumps({**spec, "phase": name, "folder": str(folder)}), encoding="utf-8"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(RANKS),
        os.path.abspath(__file__),
        "--worker",
        str(spec_file),
    ]
    # one thread per rank: the ranks share the cores
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or RANKS) // RANKS))}
    print(f"{name}: running (log: {log})", flush=True)
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    seconds = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-20:])
        raise SystemExit(f"{name} failed (exit {code}); the end of {log}:\n{tail}")
    ranks = [json.loads((folder / f"{name}.rank{r}.json").read_text()) for r in range(RANKS)]
    return ranks, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=65536, help="the field recipe's")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument(
        "--check-exact", action="store_true", help="also train 3 steps uninterrupted"
    )
    parser.add_argument("--work", type=Path, default=Path("rehearsal_350m-work"))
    parser.add_argument("--out", type=Path, default=Path("rehearsal_350m.json"))
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0
    try:
        report = rehearse(args)
    except UserError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    if not args.keep_checkpoints:  # gigabytes each
        for folder in args.work.glob("*/checkpoints"):
            shutil.rmtree(folder)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"written to {args.out}")
    return 0


def rehearse(args) -> dict[str, Any]:
    sp = _sibling("synthetic_pretrain")
    recipe = {
        "preset": args.preset,
        "vocab_size": args.vocab,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "world_size": RANKS,
        "total_steps": STEPS,
        "precision": args.precision,
        "compile_blocks": False,
        "activation_checkpointing": "none",
        "parallel": "fsdp",
        "device": "cpu",
        "log_every": 1,
        "checkpoint_every": STEPS - 1,
    }
    cfg = sp.recipe(**recipe)  # a bad flag fails here, before any process starts
    plan = sp.planned_memory(cfg, gpu="cpu", world_size=RANKS)
    work = args.work
    shards = sp.write_random_shards(
        work / "shards",
        vocab_size=args.vocab,
        tokens=(STEPS + 1) * args.micro_batch * RANKS * args.seq_len + 1,
    )
    common = {"recipe": recipe, "shards": str(shards)}
    phases = {
        "train": ("run", {"stop_after_steps": STEPS - 1, "fresh": True}),
        "resume": ("run", {"stop_after_steps": None, "fresh": False}),
    }
    if args.check_exact:
        phases["uninterrupted"] = ("reference", {"stop_after_steps": None, "fresh": True})
    results: dict[str, Any] = {}
    for name, (folder, extra) in phases.items():
        ranks, seconds = _phase(name, work / folder, {**common, **extra}, work / f"{name}.log")
        results[name] = {"ranks": ranks, "seconds": seconds}
        _print_phase(name, ranks, seconds, plan)
    losses = {r["step"]: r["loss"] for r in sp.read_metrics(sp.outputs(work / "run").metrics)}
    report: dict[str, Any] = {
        "benchmark": "rehearsal_350m",
        "setup": recipe,
        "plan": plan,
        "phases": results,
        "losses": losses,
        "resumed_at_step": results["resume"]["ranks"][0]["step"],
    }
    if args.check_exact:
        reference = sp.read_metrics(sp.outputs(work / "reference").metrics)
        report["uninterrupted_losses"] = {r["step"]: r["loss"] for r in reference}
        report["resume_exact"] = report["uninterrupted_losses"].get(STEPS) == losses.get(STEPS)
    _print_summary(report, plan)
    return report


def _print_phase(name: str, ranks: list[dict], seconds: float, plan: dict) -> None:
    for r in ranks:
        segments = ", ".join(f"{k} {v / GIB:.2f}" for k, v in r["segments"].items())
        print(
            f"  {name} rank {r['rank']}: peak RSS {r['peak_rss'] / GIB:.2f} GiB "
            f"({r['peak_rss'] / plan['total']:.2f}x the plan's {plan['total'] / GIB:.2f} GiB); "
            f"largest RSS sampled per segment (GiB): {segments}",
            flush=True,
        )
    print(f"  {name}: {seconds:.0f} s", flush=True)


def _print_summary(report: dict, plan: dict) -> None:
    s = report["setup"]
    print(
        f"\n{s['preset']} preset, vocab {s['vocab_size']:,}, seq {s['seq_len']}, micro-batch "
        f"{s['micro_batch']}, {s['precision']}, FSDP2 over {RANKS} gloo ranks on "
        f"{os.cpu_count()} CPU cores"
    )
    print("hanlm plan, per rank:")
    for item, value in plan["items"].items():
        print(f"  {item:32s} {value / GIB:7.3f} GiB")
    print(f"  {'total':32s} {plan['total'] / GIB:7.3f} GiB")
    # Only a step taken while a save is still being written holds the staged copy too.
    staging = plan["items"].get(STAGING_ITEM, 0)
    without = plan["total"] - staging * (1 + FRAGMENTATION)
    for name, phase in report["phases"].items():
        peak = max(r["peak_rss"] for r in phase["ranks"])
        print(
            f"{name:13s} measured peak RSS (worst rank) {peak / GIB:6.2f} GiB, "
            f"{peak / plan['total']:.2f}x the plan, {peak / without:.2f}x it without the "
            f"checkpoint staging ({without / GIB:.2f} GiB); {phase['seconds']:.0f} s"
        )
    print(f"losses by step: {report['losses']}")
    if "resume_exact" in report:
        print(
            f"step {STEPS} after the resume equals the uninterrupted run: {report['resume_exact']}"
        )


if __name__ == "__main__":
    sys.exit(main())
