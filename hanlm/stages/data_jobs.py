"""A data stage's jobs on the data engine (hanlm.data.engine), in one place.

The jobs work in a folder kept between runs of the same settings (a killed run resumes there):
the stage declares it (Stage.work), the pipeline makes it ready with `work_folder` before the
build and removes it once the stage is finished; a stage whose folder depends on its options (a
decontam shard's) makes its own. The jobs write into the stage's temporary output folder. On Slurm the jobs are submitted and the stage returns None: the same command, run again
once they have finished, gathers the output. Bad input (a UserError) throws the work away, since
the input must change before the stage can succeed; any other failure keeps it, to resume.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hanlm.console import info
from hanlm.data import engine
from hanlm.errors import UserError


def work_folder(work: Path, fingerprint: str, *, force: bool) -> Path:
    """The stage's work folder (RunDir names it), emptied when forced or when its settings
    differ."""
    work = Path(work)
    if force and work.exists():
        shutil.rmtree(work)
    return engine.prepare_work_dir(work, fingerprint)


T = TypeVar("T")


def run_jobs(stage: str, work: Path, make: Callable[[], T | None], *, what: str) -> T | None:
    """`make()` runs the jobs and returns the output's summary (None: submitted to a cluster)."""
    try:
        result = make()
    except UserError:
        shutil.rmtree(work, ignore_errors=True)  # the input must change before a retry
        raise
    if result is None:
        info(
            f"{stage}: jobs submitted to Slurm (logs in {work / 'logs'}); run the same command "
            f"again when they have finished to gather the {what}"
        )
    return result
