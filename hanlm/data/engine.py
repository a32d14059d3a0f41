"""The data engine: a data stage's per-document work as datatrove pipelines.

A stage is a list of `Job`s (each a datatrove pipeline over a fixed number of tasks) run in order
on the executor `[data_engine]` names: `local` (worker processes on this machine), `slurm` (array
jobs, each job depending on the one before) or `ray`. The number of tasks comes from the input,
never from the number of workers, so the output does not depend on how many run at once; each
finished task leaves a completion marker, so a killed stage run again redoes only unfinished tasks.

Tasks report how far they are in small files under the stage's work folder; the stage's process
reads them into one progress bar (documents/s, MB/s and ETA), on any executor.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path

import datatrove.executor.base as _executor_base
import datatrove.utils.logging as _datatrove_logging
import multiprocess
from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.utils.stats import PipelineStats
from loguru import logger

from hanlm.config import DataEngineSection
from hanlm.console import console
from hanlm.errors import Terminated, UserError, sigterm_deferred

PROGRESS_DIR = "progress"
FINGERPRINT_FILE = "fingerprint"


# datatrove logs every task at INFO to stderr, and a failing task's traceback; hanlm shows one
# progress bar instead, keeps datatrove's full log per task in the work folder
# (logs/JOB/logs/task_NNNNN.log), and reports a task's error itself (a UserError without traceback).
def _task_logger(logging_dir, rank: int, local_rank: int = 0, node_rank: int = -1):
    logger.remove()
    logfile = logging_dir.open(f"logs/task_{rank:05d}.log", "w")
    fmt = "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{function}:{line} - {message}"
    # catch=False: a log that cannot be written (a full disk) fails the task with that error
    # instead of loguru printing its own traceback to the terminal
    logger.add(logfile, level="DEBUG", format=fmt, colorize=False, catch=False)
    return logfile


def _quiet_default_logger() -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING", colorize=False, format="datatrove: {message}")


_executor_base.add_task_logger = _task_logger
_datatrove_logging.setup_default_logger = _quiet_default_logger
_quiet_default_logger()


# loguru works out the standard library's folders (sysconfig, ~20 ms) for every sink it adds, and
# a task adds one: once per process is enough (a private hook: another loguru is left as it is).
try:
    from loguru._better_exceptions import ExceptionFormatter as _ExceptionFormatter

    _LIB_DIRS = _ExceptionFormatter._get_lib_dirs()
    _ExceptionFormatter._get_lib_dirs = staticmethod(lambda: list(_LIB_DIRS))
except (ImportError, AttributeError):
    pass


@dataclass
class Job:
    """One pipeline over `tasks` tasks; `name` is its folder under the stage's work folder."""

    name: str
    pipeline: list
    tasks: int
    cpus: int = 1  # a task's cores (Slurm/Ray reservation)
    seconds: float = 0.0  # wall time of this run of it (0 when it had nothing left to do)


class _LocalExecutor(LocalPipelineExecutor):
    """datatrove's local executor without its manager process: the queue of local ranks and
    the shared counter it keeps cost a process and several round trips to it per task, which
    hanlm does not use (the task logs ignore the local rank; progress comes from the tasks'
    own counters). Tasks run, and are skipped when complete, exactly as datatrove runs them."""

    def run(self):
        self._launched = True
        ranks = self.get_incomplete_ranks(range(self.tasks))
        if not ranks:
            return None
        self.save_executor_as_json()
        if self.workers == 1:
            pipeline, stats = self.pipeline, []
            for rank in ranks:
                self.pipeline = deepcopy(pipeline)  # no state left over from the task before
                stats.append(self._run_for_rank(rank))
        else:
            context = multiprocess.get_context(self.start_method)
            try:
                with sigterm_deferred():  # not while forking: see hanlm.errors.stop_on_sigterm
                    pool = context.Pool(self.workers, _worker_setup, (os.getpid(),))
            except Terminated:  # it came while the workers started: they stop with it
                pool.terminate()
                raise
            with pool:
                stats = list(pool.imap_unordered(self._run_for_rank, ranks))
        total = sum(stats, start=PipelineStats())
        with self.logging_dir.open("stats.json", "wt") as f:
            total.save_to_disk(f)
        return total


_PR_SET_PDEATHSIG = 1


def _worker_setup(parent: int) -> None:
    """In each local worker: it dies with the stage's process (a worker that outlived a killed
    stage would go on writing into the run folder after another command took it over), and
    SIGTERM ends it plainly (the CLI's own handler is for the main process)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the worker may outlive a killed parent
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def local_workers(engine: DataEngineSection) -> int:
    return engine.workers or os.cpu_count() or 1


def prepare_work_dir(work: Path, fingerprint: str) -> Path:
    """The stage's work folder: kept between runs of the same settings (so a killed run resumes),
    emptied when the settings or inputs changed."""
    work = Path(work)
    marker = work / FINGERPRINT_FILE
    if work.exists() and (not marker.is_file() or marker.read_text().strip() != fingerprint):
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text(fingerprint + "\n")
    return work


def _executor(job: Job, engine: DataEngineSection, work: Path, depends):
    logging_dir = str(work / "logs" / job.name)
    if engine.executor == "local":
        workers = max(1, min(local_workers(engine), job.tasks))
        # fork: workers start at once with hanlm already imported; the parent holds no threads
        # that matter while the pool forks (the progress thread only reads files)
        return _LocalExecutor(
            job.pipeline, tasks=job.tasks, workers=workers, logging_dir=logging_dir,
            start_method="fork", depends=depends,
        )  # fmt: skip
    if engine.executor == "slurm":
        s = engine.slurm
        if not s.partition:
            raise UserError(
                "the slurm executor needs a partition",
                where="[data_engine.slurm] partition",
                fix="set data_engine.slurm.partition (sinfo lists them), or use executor = 'local'",
            )
        return SlurmPipelineExecutor(
            job.pipeline, tasks=job.tasks, time=s.time, partition=s.partition,
            cpus_per_task=max(s.cpus_per_task, job.cpus), mem_per_cpu_gb=s.mem_per_cpu_gb,
            workers=engine.workers or -1, job_name=f"hanlm-{job.name}",
            venv_path=s.venv_path or None, sbatch_args=dict(s.sbatch_args) or None,
            logging_dir=logging_dir, depends=depends,
        )  # fmt: skip
    return _ray_executor(job, engine, logging_dir, depends)


def _ray_executor(job: Job, engine: DataEngineSection, logging_dir: str, depends):
    try:
        import ray  # deferred: optional (hanlm[ray]) and heavy
        from datatrove.executor.ray import RayPipelineExecutor
    except ImportError:
        raise UserError(
            "the ray executor needs the `ray` package",
            where="[data_engine] executor = 'ray'",
            fix="pip install 'hanlm[ray]', or use executor = 'local'",
        ) from None
    r = engine.ray
    if not ray.is_initialized():
        ray.init(address=r.address or None, ignore_reinit_error=True, log_to_driver=False)
    return RayPipelineExecutor(
        job.pipeline, tasks=job.tasks, workers=engine.workers or -1, logging_dir=logging_dir,
        cpus_per_task=max(r.cpus_per_task, job.cpus), mem_per_cpu_gb=r.mem_per_cpu_gb,
        depends=depends,
    )  # fmt: skip


def incomplete_tasks(work: Path, job: Job) -> list[int]:
    done = work / "logs" / job.name / "completions"
    names = {p.name for p in done.iterdir()} if done.is_dir() else set()
    return [r for r in range(job.tasks) if f"{r:05d}" not in names]


def forget_tasks(work: Path, job: Job, ranks: Sequence[int]) -> None:
    """Remove the completion markers of `ranks`: the next run of the job runs them again."""
    done = work / "logs" / job.name / "completions"
    for rank in ranks:
        (done / f"{rank:05d}").unlink(missing_ok=True)


def run_jobs(
    jobs: Sequence[Job], engine: DataEngineSection, work: Path, *, progress: Progress | None = None
) -> bool:
    """Run the jobs in order; True when every task of every job has finished.

    Local and Ray run here and wait. Slurm submits the jobs (each depending on the one before)
    and returns False at once: running the stage again after they finish completes it."""
    work = Path(work)
    if engine.executor == "slurm":
        depends = None
        for job in jobs:
            depends = _executor(job, engine, work, depends)
        depends.run()  # launches the chain of dependencies first
        return not incomplete_tasks(work, jobs[-1])
    for job in jobs:
        if not incomplete_tasks(work, job):
            continue
        executor = _executor(job, engine, work, None)
        if progress is not None:
            progress.start(job)
        started = time.perf_counter()
        # Forked workers share the parent's memory until they write to it, and the garbage
        # collector writes to every object it visits: frozen, the parent's objects stay shared
        # (no copy of its heap per worker, no time spent collecting what the tasks never use).
        gc.freeze()
        try:
            executor.run()
        finally:
            gc.unfreeze()
            job.seconds = time.perf_counter() - started
            if progress is not None:
                progress.stop()
        if incomplete_tasks(work, job):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Progress: tasks write counters, the stage's process reads them


class TaskCounter:
    """Inside a task: documents and bytes read so far, and the units its job's progress total
    counts (bytes, unless the job counts something else such as characters), written to the work
    folder now and then."""

    def __init__(self, work: Path | str, job: str, rank: int, every_s: float = 0.5):
        self.path = Path(work) / PROGRESS_DIR / job / f"{rank:05d}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.documents = self.bytes = self.units = 0
        self._every, self._last = every_s, 0.0

    def add(self, documents: int, nbytes: int, units: int | None = None) -> None:
        self.documents += documents
        self.bytes += nbytes
        self.units += nbytes if units is None else units
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        data = {"documents": self.documents, "bytes": self.bytes, "units": self.units}
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)


def read_counters(work: Path, job: str) -> tuple[int, int, int]:
    """(documents, bytes, units) of all of a job's tasks so far."""
    documents = nbytes = units = 0
    for path in (Path(work) / PROGRESS_DIR / job).glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced this instant
            continue
        documents += data.get("documents", 0)
        nbytes += data.get("bytes", 0)
        units += data.get("units", data.get("bytes", 0))
    return documents, nbytes, units


class Progress:
    """One bar per job. A job whose tasks count their input (`totals` gives the job's total, in
    the units its TaskCounters count: bytes unless they say otherwise) shows documents/s, MB/s
    and the ETA; the others, finished tasks of all."""

    def __init__(self, work: Path, label: str, totals: dict[str, int] | None = None):
        self.work, self.label, self.totals = Path(work), label, totals or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, job: Job) -> None:
        if not console.is_terminal:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._show, args=(job,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _show(self, job: Job) -> None:
        from rich.progress import (  # deferred: rich only when a terminal shows the bar
            BarColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress  # deferred: as above

        total = self.totals.get(job.name)
        bar = RichProgress(
            TextColumn(f"[bold]{self.label} {job.name}"),
            BarColumn(),
            TextColumn("{task.fields[what]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        started = time.monotonic()
        with bar:
            task = bar.add_task("", total=total or job.tasks, what="")
            while not self._stop.wait(0.5):
                done = job.tasks - len(incomplete_tasks(self.work, job))
                what = f"{done}/{job.tasks} tasks"
                units = 0
                if total:
                    documents, nbytes, units = read_counters(self.work, job.name)
                    seconds = max(time.monotonic() - started, 1e-6)
                    what += (
                        f" · {documents:,} docs · {documents / seconds:,.0f} docs/s, "
                        f"{nbytes / seconds / 1e6:.1f} MB/s"
                    )
                bar.update(task, completed=units if total else done, what=what)
