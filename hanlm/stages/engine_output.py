"""A data stage's output built by jobs on the data engine (hanlm.data.engine), in one place.

The jobs work in a folder kept between runs of the same settings (a killed run resumes there) and
write into the stage's temporary output folder, renamed into place when they are done. On Slurm
the jobs are submitted and the stage returns None: the same command, run again once they have
finished, gathers the output. Bad input (a UserError) throws the work away, since the input must
change before the stage can succeed; any other failure keeps it, to resume.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from hanlm.console import info
from hanlm.data import engine
from hanlm.errors import UserError
from hanlm.files import atomic_output_dir, write_stage_marker


def work_folder(work: Path, fingerprint: str, *, force: bool) -> Path:
    """The stage's work folder (RunDir names it), emptied when forced or when its settings
    differ."""
    work = Path(work)
    if force and work.exists():
        shutil.rmtree(work)
    return engine.prepare_work_dir(work, fingerprint)


class _Submitted(Exception):
    """The jobs run on the cluster; the temporary output folder is discarded."""


def build(
    stage: str,
    out: Path,
    work: Path,
    fingerprint: str,
    make: Callable[[Path], dict | None],
    *,
    what: str,
) -> dict | None:
    """`make(tmp)` fills the temporary output folder and returns its summary (None: submitted
    to a cluster); then the stage marker is written and the folder renamed to `out`."""
    try:
        # a refusal of the output folder itself (someone's files in the way) keeps the work
        with atomic_output_dir(out) as tmp:
            try:
                result = make(tmp)
            except UserError:
                shutil.rmtree(work, ignore_errors=True)  # the input must change before a retry
                raise
            if result is None:  # submitted to Slurm: nothing to gather yet
                raise _Submitted
            write_stage_marker(tmp, stage, fingerprint)
    except _Submitted:
        info(
            f"{stage}: jobs submitted to Slurm (logs in {work / 'logs'}); run the same command "
            f"again when they have finished to gather the {what}"
        )
        return None
    shutil.rmtree(work, ignore_errors=True)
    return result


def remove_leftover_work(stage: str, work: Path) -> None:
    """An up-to-date stage has no use for a work folder an interrupted run left behind."""
    if Path(work).is_dir():
        shutil.rmtree(work)
        info(f"{stage}: removed {work}, left by an earlier interrupted run")
