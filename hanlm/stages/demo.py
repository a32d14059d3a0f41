"""The demo world a run's stages share: written once into the run, read by corpus, decontam,
SFT and eval."""

from __future__ import annotations

from pathlib import Path

from hanlm import demo
from hanlm.config import Config
from hanlm.files import atomic_output_dir, fingerprint, stage_fingerprint, write_stage_marker
from hanlm.stages.rundir import RunDir


def ensure_demo_world(cfg: Config, run: RunDir | Path) -> Path:
    """Write the demo world into `RUN/demo/` once (again when cfg.demo changes); its folder."""
    demo_dir = RunDir.of(run).demo
    fp = fingerprint(cfg.demo.model_dump())
    if stage_fingerprint(demo_dir) != fp:
        world = demo.build(seed=cfg.demo.seed, size_mb=cfg.demo.size_mb)
        with atomic_output_dir(demo_dir) as tmp:
            demo.write(world, tmp)
            write_stage_marker(tmp, "demo", fp)
    return demo_dir
