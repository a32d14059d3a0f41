"""`hanlm torchrun ARGS`: torchrun (torch.distributed.run, its own options and parser) whose exit
status is the ranks' own, as hanlm.exit_status defines it.

torchrun exits 1 whenever a worker fails, whatever its status, so a launcher cannot tell a rank
that stopped for preemption (75) or a host that preflight rejected (69) from a crash. This runs
torchrun's public entry points in this process and maps its `ChildFailedError` (each failed
rank's exit code) with exit_status.of_ranks. A signal to the agent itself (a scheduler stopping
the job) is forwarded to the workers by torchrun, which then stop after their checkpoint: 75.

The agent itself can fail while its workers run: the host whose agent started first holds the
c10d rendezvous store, and when that host is lost every other agent's next poll of the store
raises. The agent then stops its workers (SIGTERM: they still name the lost peer and exit 75)
and their exit codes go with it; so each hanlm worker also writes its status into a folder this
command names in their environment (STATUS_DIR), and that is what it exits with.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from hanlm import exit_status, ranks

STATUS_DIR = "HANLM_TORCHRUN_STATUS_DIR"  # where each worker writes its exit status, by rank


def processes_below(pid: int) -> list[int]:
    """Every process below `pid`, nearest first, read from /proc: torchrun starts each rank in
    a session of its own, so a signal to the launcher's process group does not reach them."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop(0)  # breadth first: a worker before its own children
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def main(argv: list[str]) -> int:
    # deferred: torch (seconds to import); `hanlm --help` lists this command without it
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run  # deferred: as above

    args = parse_args(argv)
    status_dir = tempfile.TemporaryDirectory(prefix="hanlm-torchrun-")
    os.environ[STATUS_DIR] = status_dir.name  # the workers inherit this environment
    try:
        run(args)
    except ChildFailedError as failed:
        codes = [failure.exitcode for failure in failed.failures.values()]
        _, first = failed.get_first_failure()
        status = exit_status.of_ranks(codes, first.exitcode)
        print(
            f"hanlm torchrun: ranks exited with {sorted(set(codes))}: exit status {status}",
            file=sys.stderr,
            flush=True,
        )
        return status
    except SignalException as signalled:
        print(
            f"hanlm torchrun: stopped by signal {signalled.sigval.name}: exit status "
            f"{exit_status.STOPPED}",
            file=sys.stderr,
            flush=True,
        )
        return exit_status.STOPPED
    except Exception as agent_failed:
        codes = _reported(status_dir)
        if not codes:
            raise  # before any hanlm worker ended: torchrun's own error, as it is
        failed = [code for code in codes if code != exit_status.SUCCESS]
        status = exit_status.of_ranks(failed, failed[0]) if failed else exit_status.SUCCESS
        print(
            f"hanlm torchrun: torchrun's agent failed ({type(agent_failed).__name__}: "
            f"{agent_failed}); its ranks exited with {sorted(set(codes))}: exit status {status}",
            file=sys.stderr,
            flush=True,
        )
        return status
    finally:
        status_dir.cleanup()
    return exit_status.SUCCESS


def parse_args(argv: list[str]):
    """torchrun's own parser, without its abbreviations: argparse reads any prefix of one of
    torchrun's options as that option, even among the script's arguments, so hanlm's `--run DIR`
    after `-m hanlm sft` was refused as ambiguous (`--run-path`, `--run_path`)."""
    from torch.distributed.run import get_args_parser  # deferred: as in main

    parser = get_args_parser()
    parser.allow_abbrev = False
    return parser.parse_args(argv)


def report_rank_status(status: int) -> None:
    """Called by a hanlm command as it ends: under `hanlm torchrun`, tell it this rank's status."""
    folder = os.environ.get(STATUS_DIR)
    if folder and ranks.launched():
        rank = ranks.rank()
        with contextlib.suppress(OSError):  # its agent, and the folder, may be gone already
            (Path(folder) / f"rank-{rank}").write_text(str(status))


def _reported(status_dir: tempfile.TemporaryDirectory) -> list[int]:
    codes = []
    for path in sorted(Path(status_dir.name).glob("rank-*")):
        with contextlib.suppress(OSError, ValueError):
            codes.append(int(path.read_text()))
    return codes
