"""benchmarks/optimizer.py in its smoke mode, on a small sample of the shared Korean text: every
size, optimizer and learning rate trains, and the report says what the verdict rests on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_sweeps_both_optimizers_at_both_sizes(shared_data, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "curves.png"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "optimizer.py"), "--smoke", "--data",
         str(shared_data), "--work", str(tmp_path / "runs"), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(out.with_suffix(".json").read_text())
    assert out.stat().st_size > 10_000  # the curves were drawn
    assert set(report["sizes"]) == {"S", "M"}
    small, medium = (report["sizes"][k]["parameters"] for k in ("S", "M"))
    assert medium >= 3 * small  # the two sizes, at least 3x apart
    for row in report["sizes"].values():
        assert set(row["runs"]) == {"adamw", "muon"}
        assert all(len(runs) == len(report["lrs"]) for runs in row["runs"].values())
        assert row["best"]["adamw"]["final_bpb"] > 0 and row["best"]["muon"]["final_bpb"] > 0
        state = row["optimizer_state_bytes"]
        assert state["muon"] < state["adamw"]  # one buffer for the blocks' matrices
        assert row["step_time_ratio"] > 0
    assert report["verdict"] in ("adamw", "muon")
    assert "default by this measurement" in result.stdout
