"""`hanlm rehearse --tune`: the candidates the planner says fit, and the fastest that fits kept
with the --set line that adopts it (the timing itself: tests/integration/test_rehearse.py)."""

from __future__ import annotations

import pytest

from hanlm.config import load_config
from hanlm.rehearse import tune
from hanlm.stages.rundir import RunDir


def test_candidates_double_the_micro_batch_while_the_plan_fits(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = load_config("demo")
    plenty = tune.candidates(cfg, capacity_gb=1e6)
    micro = [c["micro_batch"] for c in plenty if c["recompute"] == "none" and not c["compile"]]
    assert micro == [8 * 2**k for k in range(tune.MAX_DOUBLINGS + 1)]
    assert {"compile": True, "micro_batch": micro[-1]}.items() <= plenty[len(micro)].items()
    tight_gb = tune._planned_gb(cfg, 16, "none") / tune.HEADROOM + 0.001  # 16 fits, 32 not
    tight = tune.candidates(cfg, capacity_gb=tight_gb)
    assert [c["micro_batch"] for c in tight if c["recompute"] == "none"] == [8, 16, 16]
    assert all(c["planned_gb"] <= tune.HEADROOM * tight_gb for c in tight)


def test_the_fastest_candidate_that_fits_wins(monkeypatch, tmp_path):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = load_config("demo")
    monkeypatch.setattr(tune, "device_capacity_gb", lambda: 1e6)
    speeds = {8: 1000.0, 16: 1500.0, 32: 1900.0, 64: 2500.0, 128: 1200.0, 256: 1100.0}

    def timed(cfg, sub, c, capacity):
        fits = c["micro_batch"] != 64  # the fastest one ran out of room: never chosen
        speed = speeds[c["micro_batch"]] * (1.1 if c["compile"] else 1.0)
        return {**c, "name": tune._name(c), "fits": fits, "tokens_per_s": speed}

    monkeypatch.setattr(tune, "_time", timed)
    result = tune.tune(cfg, RunDir(tmp_path / "run"))
    assert len(result["candidates"]) == len(tune.candidates(cfg, 1e6))
    winner = result["winner"]
    assert winner["name"] == "mb32-none-eager"
    # the demo's global batch of 2,048 tokens is no multiple of 32 x 256: the line says so
    assert winner["set"] == (
        "--set pretrain.micro_batch=32 --set pretrain.global_batch_tokens=8192"
    )
    assert "1.90x the recipe's" in winner["why"]


@pytest.mark.parametrize("ok", [False])
def test_no_candidate_that_fits_means_no_winner(monkeypatch, tmp_path, ok):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(tune, "device_capacity_gb", lambda: 1e6)
    monkeypatch.setattr(
        tune, "_time", lambda cfg, sub, c, cap: {**c, "name": tune._name(c), "fits": ok}
    )
    assert tune.tune(load_config("demo"), RunDir(tmp_path / "run"))["winner"] is None
