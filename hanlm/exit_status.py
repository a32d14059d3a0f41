"""What hanlm's exit status tells the launcher that started it (a shell, torchrun, SkyPilot,
Slurm): finished, the user's mistake, this host is unfit, or stopped early and resumable.

The two non-zero statuses an engine should retry are the sysexits.h ones: 75 (EX_TEMPFAIL) for a
run stopped by SIGTERM or SIGUSR1, or by losing a peer host, with everything finished kept (the
same command continues it),
and 69 (EX_UNAVAILABLE) for a host preflight judged NO-GO (give it back and try another). A
user's mistake (2) is never worth a retry: the same input fails the same way.
"""

from __future__ import annotations

SUCCESS = 0
FAILED = 1  # a bug (with its traceback), or a check that failed (`hanlm doctor`)
USER_ERROR = 2  # bad input: the message says what, where and how to fix it
HOST_REJECTED = 69  # preflight said NO-GO: this host (or set of hosts) cannot run the training
STOPPED = (
    75  # stopped by SIGTERM / SIGUSR1 or a lost peer; the last checkpoint committed: run again
)
INTERRUPTED = 130  # Ctrl-C

RETRY_ELSEWHERE = (HOST_REJECTED, STOPPED)  # what a launcher restarts, on another host


def of_ranks(exit_codes: list[int], first_failure: int | None = None) -> int:
    """The status of a torchrun job from its failed ranks' exit codes (torchrun itself exits 1
    whatever they were): stopped when any rank stopped (the others' failures follow from it),
    else the first failure's status when it is one of hanlm's, else FAILED."""
    if STOPPED in exit_codes:
        return STOPPED
    if first_failure in (USER_ERROR, HOST_REJECTED):
        return first_failure
    if (
        exit_codes
        and all(code == exit_codes[0] for code in exit_codes)
        and exit_codes[0]
        in (
            USER_ERROR,
            HOST_REJECTED,
        )
    ):
        return exit_codes[0]
    return FAILED
