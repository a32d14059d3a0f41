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

import contextlib
import ctypes
import gc
import json
import os
import pickle
import shutil
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.utils.stats import MetricStatsDict

from hanlm.config import DataEngineSection
from hanlm.console import console
from hanlm.errors import UserError, sigterm_deferred

PROGRESS_DIR = "progress"
FINGERPRINT_FILE = "fingerprint"
EXECUTOR_LOG = "executor.log"  # in logs/JOB/: what datatrove printed while the job ran


@dataclass
class Job:
    """One pipeline over `tasks` tasks; `name` is its folder under the stage's work folder."""

    name: str
    pipeline: list
    tasks: int
    cpus: int = 1  # a task's cores (Slurm/Ray reservation)
    seconds: float = 0.0  # wall time of this run of it (0 when it had nothing left to do)


def _run_local(executor: LocalPipelineExecutor, logging_dir: Path) -> None:
    """Run datatrove's local executor, as datatrove documents it, in a child process of its own.

    datatrove prints every task's log lines and a failing task's traceback to stderr; hanlm shows
    one progress bar instead. The child's stdout and stderr go to logs/JOB/executor.log (each task
    also keeps its own log there, as datatrove writes it), and the exception that stopped the job
    comes back through a pipe (a full disk cannot stop it) and is raised here as it was: a
    UserError reads as one, without a traceback. The child and every process it starts
    (datatrove's manager and pool workers) die with this one, and a SIGTERM ends them plainly
    (this process's handler is for this process)."""
    logging_dir.mkdir(parents=True, exist_ok=True)
    log = logging_dir / EXECUTOR_LOG
    failure_read, failure_write = os.pipe()
    parent = os.getpid()
    with sigterm_deferred():  # not while forking: see hanlm.errors.stop_on_sigterm
        pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.close(failure_read)
            _die_with_parent(parent)
            _children_die_with_their_parent()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            executor.run()
            status = 0
        except BaseException as error:
            with contextlib.suppress(BaseException):  # a full disk cannot take the log
                traceback.print_exc()
            with contextlib.suppress(BaseException):
                os.write(failure_write, _pickled(error))
        finally:
            os._exit(status)
    os.close(failure_write)
    try:
        _, status = os.waitpid(pid, 0)
        payload = _read_all(failure_read)
    except BaseException:  # SIGTERM or Ctrl-C here: the child and its workers stop too
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(failure_read)
    if os.waitstatus_to_exitcode(status) != 0:
        error = _failure(payload, log, status)
        # a bug or a failing disk: say where the task's traceback is (notes: Python 3.11+)
        if not isinstance(error, UserError) and hasattr(error, "add_note"):
            error.add_note(f"the data engine's log, with the task's traceback: {log}")
        raise error


def _die_with_parent(parent: int) -> None:
    """In a process the data engine started: SIGTERM ends it plainly, and it dies with its
    parent (a worker that outlived a killed stage would go on writing into the run folder after
    another command took it over)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: it may outlive a killed parent
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _children_die_with_their_parent() -> None:
    """Every process forked from here on (datatrove's manager and pool workers, and whatever
    they fork) dies with the process that forked it."""
    forking = [os.getpid()]
    os.register_at_fork(
        before=lambda: forking.__setitem__(0, os.getpid()),
        after_in_child=lambda: _die_with_parent(forking[0]),
    )


_PIPE_BYTES = 60_000  # under a pipe's 64 KiB buffer: the child writes it without a reader


def _pickled(error: BaseException) -> bytes:
    try:
        payload = pickle.dumps(error)
    except Exception:  # an exception that does not pickle: its text
        payload = b""
    if not payload or len(payload) > _PIPE_BYTES:
        text = f"{type(error).__name__}: {error}"[: _PIPE_BYTES // 8]
        payload = pickle.dumps(RuntimeError(text))
    return payload


def _read_all(fd: int) -> bytes:
    """What the child wrote into the pipe before it ended (its own children may still hold the
    pipe open, so this reads what is there instead of waiting for the end)."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _failure(payload: bytes, log: Path, status: int) -> BaseException:
    try:
        return pickle.loads(payload)
    except Exception:  # nothing came (killed by a signal, or the pipe write failed)
        code = os.waitstatus_to_exitcode(status)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return RuntimeError(f"the data engine's process {how}; its log: {log}")


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
        return LocalPipelineExecutor(
            job.pipeline, tasks=job.tasks, workers=workers, logging_dir=logging_dir,
            start_method="fork", depends=depends,
        )  # fmt: skip
    if engine.executor == "slurm":
        slurm = engine.slurm
        if not slurm.partition:
            raise UserError(
                "the slurm executor needs a partition",
                where="[data_engine.slurm] partition",
                fix="set data_engine.slurm.partition (sinfo lists them), or use executor = 'local'",
            )
        return SlurmPipelineExecutor(
            job.pipeline, tasks=job.tasks, time=slurm.time, partition=slurm.partition,
            cpus_per_task=max(slurm.cpus_per_task, job.cpus), mem_per_cpu_gb=slurm.mem_per_cpu_gb,
            workers=engine.workers or -1, job_name=f"hanlm-{job.name}",
            venv_path=slurm.venv_path or None, sbatch_args=dict(slurm.sbatch_args) or None,
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
    ray_cfg = engine.ray
    if not ray.is_initialized():
        ray.init(address=ray_cfg.address or None, ignore_reinit_error=True, log_to_driver=False)
    return RayPipelineExecutor(
        job.pipeline, tasks=job.tasks, workers=engine.workers or -1, logging_dir=logging_dir,
        cpus_per_task=max(ray_cfg.cpus_per_task, job.cpus), mem_per_cpu_gb=ray_cfg.mem_per_cpu_gb,
        depends=depends,
    )  # fmt: skip


def incomplete_tasks(work: Path, job: Job) -> list[int]:
    done = work / "logs" / job.name / "completions"
    names = {p.name for p in done.iterdir()} if done.is_dir() else set()
    return [rank for rank in range(job.tasks) if f"{rank:05d}" not in names]


def task_counts(work: Path, job: Job | str, rank: int) -> Counter:
    """What one finished task counted with its steps' `stat_update`, label by label (summed
    over the steps), from the stats file datatrove wrote for it."""
    name = job if isinstance(job, str) else job.name
    path = Path(work) / "logs" / name / "stats" / f"{rank:05d}.json"
    with open(path, encoding="utf-8") as f:
        steps = json.load(f)  # PipelineStats.to_json: one entry per step
    counts: Counter = Counter()
    for step in steps:
        for label, metric in MetricStatsDict.from_dict(step["stats"]).items():
            counts[label] += int(metric.total)
    return counts


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
            if engine.executor == "local":
                _run_local(executor, work / "logs" / job.name)
            else:
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
