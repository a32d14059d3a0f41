"""MFU: pretraining and SFT divide by the one peak FLOP/s rule (hanlm.train.build.mfu_peak)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hanlm.config import Config
from hanlm.train import build, parallel, precision


@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp8-emulate"])
def test_pretraining_and_sft_divide_mfu_by_the_same_peak(mode, monkeypatch):
    """One peak FLOP/s rule (build.mfu_peak): the same model, precision and tokens/s give the
    same MFU whichever training reports it: the peak of the number format training resolved
    to."""
    cpu = torch.device("cpu")
    asked = []
    monkeypatch.setattr(build, "device_peak_flops",
                        lambda device, name: (asked.append(name) or 1e12, name))  # fmt: skip
    at = build.Placement(parallel.Dist(0, 1, 0, cpu), "single", precision.resolve(mode, cpu))
    cfg = Config()
    job = build.TrainingJob(
        total_steps=1, accumulation=1, train_loader=None, val_loader=None,
        checkpoints_dir=Path("c"), checkpoints_place="p", metrics_path=Path("m"),
        flops_per_token=6e6, fingerprint="f", settings="s", student_tokenizer=Path("t"),
    )  # fmt: skip
    pretraining = build.trainer_settings(job, build.Components.pretraining(cfg), at)
    sft = build.trainer_settings(job, build.Components.sft(cfg), at)
    assert pretraining.peak_flops == sft.peak_flops == 1e12
    assert asked == [at.numerics.name] * 2
