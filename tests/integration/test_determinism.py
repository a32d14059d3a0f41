"""Determinism under load: the same config and seed on the same machine, with the same number of
CPU threads, train the same weights bit for bit, however busy the machine is (hanlm.train.threads).

Some of torch's CPU kernels split a sum among the threads of a parallel region, so the number of
threads that really ran a region shows in the last bits. With OpenMP's dynamic adjustment on
(OMP_DYNAMIC=true) the runtime gives a region fewer threads while the machine's load average is
high: two runs of one config then parted at the step after the first checkpoint, on a busy
machine. hanlm turns the adjustment off and keeps torch's thread count fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hanlm.train import checkpoint_layout, threads

WORKER = Path(__file__).parents[1] / "workers" / "determinism_worker.py"
VOCAB = 256

# A GPT-2 of 0.12M parameters: its LayerNorms' weight gradients are sums split among the threads,
# so the bits show how many threads ran them (the Llama presets' CPU kernels happened to give the
# same bits with 1 to 8 threads on the machine this was written on, LayerNorm's did not).
GPT2 = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 64,
    "vocab_size": VOCAB,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}

# Spins on one core until killed, or for 120 s at most.
BUSY = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


def write_shards(folder: Path) -> Path:
    """Random tokens in the shards format (hanlm.data.loader): 8 train files, 1 val file."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    splits = {}
    for split, files in (("train", 8), ("val", 1)):
        entries = []
        for i in range(files):
            name = f"{split}-{i:05d}.bin"
            rng.integers(0, VOCAB, 2_000, dtype=np.uint16).tofile(folder / name)
            entries.append({"path": name, "source": "corpus", "tokens": 2_000, "documents": 1})
        splits[split] = {"files": entries, "tokens": 2_000 * files, "documents": files}
    manifest = {
        "format": 2,
        "dtype": "uint16",
        "vocab_size": VOCAB,
        "tokenizer_sha256": "0" * 64,
        "eod_id": 1,
        "splits": splits,
        "special_token_counts": {},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def start_training(shards: Path, model: Path, out: Path, **env: str) -> subprocess.Popen:
    # 2 threads on any machine, so that the LayerNorms' sums are split; idle threads sleep rather
    # than spin (how they wait changes no result, and spinning beside a busy process is slow)
    fixed = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "passive", "PYTHONWARNINGS": "ignore"}
    environment = {**os.environ, **fixed, **env}
    cmd = [sys.executable, str(WORKER), str(shards), str(model), str(out)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment
    )


def finish(process: subprocess.Popen) -> str:
    """What the training printed, once it exited 0."""
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    return output


def final_state(out: Path) -> dict:
    """The final checkpoint's model and optimizer, as one nested dict of tensors and values."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = out / "final.pt"
    dcp_to_torch_save(checkpoint_layout.latest(out / "checkpoints"), whole)
    return torch.load(whole, weights_only=True)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def differences(a, b, path: str = "") -> list[str]:
    """Where two nested states differ, bit for bit."""
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        return [] if same and torch.equal(_bytes(a), _bytes(b)) else [path]
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return [path]
        return [
            d for key in sorted(a, key=str) for d in differences(a[key], b[key], f"{path}/{key}")
        ]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return [path]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}/{i}")
        ]
    return [] if a == b else [path]


def grad_norms(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["grad_norm"] for r in map(json.loads, lines) if "grad_norm" in r]


def test_pinning_turns_openmp_dynamic_adjustment_off_and_keeps_the_count():
    runtimes = threads._openmp_runtimes()
    if not any(hasattr(r, "omp_set_dynamic") for r in runtimes):
        pytest.skip("no OpenMP runtime in this process: no thread count adjusts itself")
    count = torch.get_num_threads()
    for runtime in runtimes:
        if hasattr(runtime, "omp_set_dynamic"):
            runtime.omp_set_dynamic(1)  # what OMP_DYNAMIC=true starts with
    assert threads.dynamic_adjustment()
    assert threads.pin() == count == torch.get_num_threads()
    assert not threads.dynamic_adjustment()


def test_same_weights_bit_for_bit_on_a_busy_machine(tmp_path):
    """The same 5-step pretraining twice at once, 2 threads each, beside a busy process: one with
    OpenMP's default fixed thread count, one with OMP_DYNAMIC=true (without hanlm's pin, that one
    trained with 1 thread whenever the load average was at least about one core, and its weights
    differed). Both at once also keep the machine loaded for each other."""
    shards = write_shards(tmp_path / "shards")
    model = tmp_path / "config.json"
    model.write_text(json.dumps(GPT2), encoding="utf-8")

    processes = [subprocess.Popen([sys.executable, "-c", BUSY])]
    try:
        processes.append(start_training(shards, model, tmp_path / "steady"))
        processes.append(start_training(shards, model, tmp_path / "dynamic", OMP_DYNAMIC="true"))
        said = [finish(training) for training in processes[1:]]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert all("2 CPU threads" in output for output in said)

    assert grad_norms(tmp_path / "dynamic") == grad_norms(tmp_path / "steady")
    one, two = final_state(tmp_path / "steady"), final_state(tmp_path / "dynamic")
    assert one["model"], "the checkpoint holds no weights"
    assert differences(one, two) == []
