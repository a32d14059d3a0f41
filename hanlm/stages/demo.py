"""The demo world a run's stages share (`RUN/demo/`): made on demand for the stages that read
it (corpus inputs `demo`, the `demo` benchmark, SFT's default conversations, the demo tasks)."""

from __future__ import annotations

from hanlm import demo
from hanlm.stages.stage import Stage, StageContext


def build(ctx: StageContext) -> dict:
    settings = ctx.cfg.demo
    world = demo.build(
        seed=settings.seed, size_mb=settings.size_mb, reverse_share=settings.reverse_share
    )
    paths = demo.write(world, ctx.out)
    return {kind: path.name for kind, path in paths.items()}


STAGE = Stage(
    name="demo",
    version=1,
    output=lambda run: run.demo,
    result=None,
    reads=("demo",),
    build=build,
)
