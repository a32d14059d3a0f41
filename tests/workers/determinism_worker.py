"""Run by tests/integration/test_determinism.py in a process of its own: a short pretraining on CPU, as
`hanlm pretrain` trains (hanlm.train.pretrain.pretrain), on the given shards and model.

Usage: python tests/workers/determinism_worker.py SHARDS_DIR MODEL OUT_DIR
Writes OUT_DIR/checkpoints/ (the final step's checkpoint among them) and OUT_DIR/metrics.jsonl.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hanlm.config import Config
from hanlm.train.pretrain import PretrainData, pretrain

# TINY_PRETRAIN of tests/conftest.py, 5 steps: a validation and an asynchronous checkpoint at
# step 4 (the step after them is where the reported runs first parted)
SETTINGS = {
    "pretrain": {"seq_len": 64, "micro_batch": 4, "global_batch_tokens": 512, "max_steps": 5},
    "optimizer": {"lr": 1e-2, "warmup_steps": 2},
    "precision": {"mode": "fp32"},
    "parallel": {"device": "cpu"},
    "logging": {"log_every": 1, "eval_every": 4, "eval_batches": 2},
    "checkpoint": {"every": 4},
}


@dataclass(frozen=True)
class Outputs:
    checkpoints: Path
    metrics: Path
    place: str = "determinism/pretrain"  # under a checkpoint mirror (none is set)


def main(shards: Path, model: str, out: Path) -> None:
    manifest = json.loads((shards / "manifest.json").read_text(encoding="utf-8"))
    cfg = Config.model_validate({"model": {"preset": model}, **SETTINGS})
    data = PretrainData(
        shards_dir=shards,
        shards_fingerprint=None,
        vocab_size=manifest["vocab_size"],
        tokenizer_sha256=manifest["tokenizer_sha256"],
        tokenizer_dir=shards,  # read only by distillation, which is off
        token_byte_lengths=[1] * manifest["vocab_size"],
    )
    outputs = Outputs(out / "checkpoints", out / "metrics.jsonl")
    summary = pretrain(cfg, data, outputs, settings_fp="determinism")
    assert summary.completed, summary


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
