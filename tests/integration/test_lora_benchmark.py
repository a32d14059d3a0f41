"""benchmarks/lora.py in its smoke mode, in bf16: both variants run hanlm's real SFT step (LoRA
with its frozen linears held in bf16) and the planner's lines come out, so the benchmark stays
runnable at the 125m scale it reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_runs_both_variants_and_the_planner(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "lora.py"), "--smoke", "--precision", "bf16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert "bf16 on the CPU" in out
    trained = dict(re.findall(r"^\s+(full|lora)\s+trained\s+([\d,]+) of", out, re.MULTILINE))
    totals = dict(re.findall(r"^\s+(full|lora)\s+trained\s+[\d,]+ of ([\d,]+)", out, re.M))
    assert trained["full"] == totals["full"]
    assert 0 < int(trained["lora"].replace(",", "")) < int(totals["lora"].replace(",", "")) / 2
    assert re.search(r"lora / full: peak memory [\d.]+x, step time [\d.]+x", out)
    assert "plan (ko-1.3b-8x5090, one rtx5090" in out
    assert re.search(r"\(full (fits|does not fit), LoRA fits\)", out)
