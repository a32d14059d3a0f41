"""The `hanlm` process: parse and run one command, turn its outcome into an exit status
(hanlm.exit_status) and its errors into one line, and stop cleanly on a host's stop signal."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from hanlm import exit_status, remote_code
from hanlm.cli.parser import parse_args
from hanlm.disk_errors import storage_error
from hanlm.errors import PeerLost, PreflightNoGo, Terminated, UserError, stop_on_sigterm
from hanlm.launch import torchrun
from hanlm.train.preemption import Preempted

# Commands that write into their run folder hold its lock (hanlm.run_lock) while they run.
WRITES_RUN = frozenset(
    {"run", "corpus", "decontam", "tokenizer", "shards", "pretrain", "export", "preflight"}
    | {"launch"}
    | {"sft", "eval", "publish"}
)


# ... and of those, the ones that may start a run folder; the others need one to exist (and
# say so themselves when it does not).
STARTS_RUN = frozenset({"run", "corpus", "decontam", "preflight", "launch"})


def _folder_to_lock(args: argparse.Namespace) -> Path | None:
    if args.command not in WRITES_RUN:
        return None
    out = getattr(args, "out", None)
    if out is not None:
        # decontam --out DIR keeps its results as a run folder would; eval --out writes a file
        # set of its own and only reads the run
        return Path(out) if args.command == "decontam" else None
    if args.command not in STARTS_RUN and not Path(args.run).is_dir():
        return None
    return args.run


STOP_GRACE_S = 20.0  # after SIGTERM, the longest the unwinding may take before a hard exit
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # what a host or scheduler sends before it stops us
_STOPPED = (
    "stopped by a signal: what was finished is kept; run the same command to continue "
    f"(exit status {exit_status.STOPPED})"
)


def _exit_after_grace() -> None:
    """The unwinding did not end: the exception met multiprocessing's pool in a lock or a join
    it cannot leave. Every output is committed atomically and the data workers die with this
    process (PR_SET_PDEATHSIG), so ending here loses nothing a rerun needs."""
    print(f"{_STOPPED} (forced after {STOP_GRACE_S:.0f} s)", file=sys.stderr, flush=True)
    os._exit(exit_status.STOPPED)


def _terminated_handler(main_pid: int):
    def handle(signum, frame) -> None:
        if os.getpid() != main_pid:  # a forked worker that inherited it: end as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        watchdog = threading.Timer(STOP_GRACE_S, _exit_after_grace)
        watchdog.daemon = True
        watchdog.start()
        stop_on_sigterm()

    return handle


def _ignore_stop_signals(installed: dict) -> bool:
    """Stopping already: a second stop signal (torchrun sends one to the other ranks once one
    has exited) must not interrupt the way out and turn its 75 or 69 into a traceback."""
    for sig in installed:
        signal.signal(sig, signal.SIG_IGN)
    return True


def _print_error(message: str) -> None:
    # deferred: rich (~0.05 s), which `hanlm --help` and a mistyped argument do without
    from rich.markup import escape

    from hanlm.console import console  # deferred: rich too

    # escaped: a message may hold [brackets] (TOML tables, paths) that are not markup
    console.print(f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status is one of hanlm.exit_status's."""
    as_program = argv is None  # not called from Python: the process ends with this command
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["torchrun"] and not {"-h", "--help"} & set(argv[1:2]):
        # torchrun's own parser reads its options; its agent handles signals itself
        return torchrun.main(argv[1:])
    status = exit_status.FAILED  # unless the command returns: a bug's traceback
    try:
        status = _run_command(argv, as_program)
        return status
    except SystemExit as e:  # argparse: --help, or bad arguments
        status = e.code if isinstance(e.code, int) else exit_status.USER_ERROR
        raise
    finally:
        if as_program:
            torchrun.report_rank_status(status)


def _run_command(argv: list[str], as_program: bool) -> int:
    args = parse_args(argv)
    from hanlm import run_lock  # deferred: it prints with rich, which --help does without

    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        handler = _terminated_handler(os.getpid())
        previous_handlers = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    folder = _folder_to_lock(args)
    stopped = False
    try:
        with (
            run_lock.hold(folder) if folder is not None else contextlib.nullcontext(),
            remote_code.scope(),
        ):
            return args.func(args)
    except PreflightNoGo as e:
        stopped = _ignore_stop_signals(previous_handlers)  # every rank leaves with 69
        _print_error(e.message)
        return exit_status.HOST_REJECTED
    except PeerLost as e:
        stopped = _ignore_stop_signals(previous_handlers)  # torchrun stops the other ranks
        _print_error(e.message)
        return exit_status.STOPPED  # the last checkpoint is committed: run again on new hosts
    except UserError as e:
        _print_error(e.message)
        return exit_status.USER_ERROR
    except Preempted as e:
        from hanlm.console import console  # deferred: rich (see _print_error)

        stopped = _ignore_stop_signals(previous_handlers)
        console.print(
            f"[bold yellow]preempted:[/bold yellow] {e} (exit status {exit_status.STOPPED})",
            soft_wrap=True,
        )
        return exit_status.STOPPED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exit_status.INTERRUPTED
    except Terminated:
        stopped = _ignore_stop_signals(previous_handlers)
        print(_STOPPED, file=sys.stderr)
        return exit_status.STOPPED
    except Exception as e:
        error = storage_error(e, folder)
        if error is None:
            raise  # a bug: keep its traceback
        _print_error(error.message)
        return exit_status.USER_ERROR
    finally:
        for sig, previous in previous_handlers.items():
            # a stopped program keeps ignoring them until it has exited, which would otherwise
            # turn its 75 into a death by signal; called from Python, the handlers are put back
            signal.signal(sig, signal.SIG_IGN if stopped and as_program else previous)
