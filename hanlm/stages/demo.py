"""The demo world a run's stages share: written once into the run, read by corpus, decontam,
SFT and eval."""

from __future__ import annotations

from pathlib import Path

from hanlm import demo
from hanlm.config import Config
from hanlm.files import (
    STAGE_MARKER,
    atomic_output_dir,
    check_folder_path,
    claim_output_file,
    fingerprint,
    read_json,
    stage_fingerprint,
    write_stage_marker,
)
from hanlm.stages.rundir import RunDir


def world_settings(cfg: Config) -> dict:
    """The [demo] settings that make the world, as its fingerprints name them: an option at its
    default that leaves the world unchanged is left out, so earlier runs stay recognised."""
    settings = cfg.demo.model_dump()
    if not settings["reverse_share"]:
        del settings["reverse_share"]
    return settings


def ensure_demo_world(cfg: Config, run: RunDir | Path) -> Path:
    """Write the demo world into `RUN/demo/` once (again when cfg.demo changes); its folder."""
    demo_dir = RunDir.of(run).demo
    fp = fingerprint(world_settings(cfg))
    if stage_fingerprint(demo_dir) != fp:
        world = demo.build(
            seed=cfg.demo.seed, size_mb=cfg.demo.size_mb, reverse_share=cfg.demo.reverse_share
        )
        with atomic_output_dir(demo_dir) as tmp:
            demo.write(world, tmp)
            write_stage_marker(tmp, "demo", fp)
    return demo_dir


def _holds_a_demo_world(folder: Path) -> bool:
    """Whether `folder` carries the demo stage's marker (its files are the demo world's)."""
    try:
        return read_json(folder / STAGE_MARKER).get("stage") == "demo"
    except (OSError, ValueError, AttributeError):
        return False


def write_standalone(
    out: Path, seed: int, size_mb: float, *, force: bool, name: str = "--out"
) -> dict[str, Path]:
    """`hanlm demo --out OUT`: the demo world's files into `out`, next to whatever else it holds
    (only the world's files are checked, and replaced only with `force` when they are an earlier
    demo world's). `name` is how errors call `out`. The files written, by kind."""
    out = Path(out)
    check_folder_path(out, name)
    for file in (*demo.FILE_NAMES.values(), STAGE_MARKER):
        claim_output_file(
            out / file,
            is_earlier_output=lambda _: _holds_a_demo_world(out),
            replace_earlier=force,
            name=name,
        )
    paths = demo.write(demo.build(seed=seed, size_mb=size_mb), out)
    # the same marker a run's demo/ folder has: a later --force knows the files are the demo's
    write_stage_marker(out, "demo", fingerprint({"seed": seed, "size_mb": size_mb}))
    return paths
