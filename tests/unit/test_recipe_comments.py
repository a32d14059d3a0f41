"""The figures a recipe's comments quote about the planner are the planner's: an MFU factor, the
memory per GPU at its micro-batch, what each source reads, the data stages' hours. A comment
that states a figure must be the figure the code uses (the field recipe said 0.7 for FP8 while
the planner used 0.6)."""

from __future__ import annotations

import re

from hanlm.config import load_config
from hanlm.config.loading import RECIPES_DIR
from hanlm.plan.recipe import plan_recipe
from hanlm.plan.time_model import FP8_MFU_FACTOR, default_mfu

GIB = 1 << 30


def _comments(path) -> str:
    """The recipe's comments as one line of text (a comment may span several lines)."""
    lines = [line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line]
    return " ".join(" ".join(lines).split())


def test_the_field_recipes_planner_figures_are_the_planners(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the figures the comments quote are offline's
    path = RECIPES_DIR / "ko-1.3b-8x5090.toml"
    text = _comments(path)
    bf16, _ = default_mfu("rtx5090", "bf16")
    assert f"mfu: unset, {bf16:.0%} for an RTX 5090 in bf16" in text
    assert f"the FP8 default is {FP8_MFU_FACTOR:g} x that" in text
    plan = plan_recipe(load_config(path))
    quoted_gib = float(re.search(r"plan: ~([\d.]+) GiB of 32", text)[1])
    assert quoted_gib == round(plan.memory.total / GIB, 1)
    reads = {row["source"]: row["reads"] for row in plan.mixture}
    quoted = dict(re.findall(r"(web|wiki) (?:reads )?([\d.]+)B", text))
    assert quoted == {name: f"{reads[name] / 1e9:.2f}" for name in ("web", "wiki")}
    quoted_minutes = int(re.search(r"the data stages then take ~(\d+) min", text)[1])
    assert abs(quoted_minutes - plan.data["total_hours"] * 60) < 2.5
    web_gb = float(re.search(r"~(\d+) GB of FineWeb-2", text)[1])
    assert abs(web_gb - reads["web"] * 2.5 * 2.5 / 1e9) < 1
