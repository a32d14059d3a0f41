"""`hanlm torchrun ARGS`: torchrun (torch.distributed.run, its own options and parser) whose exit
status is the ranks' own, as hanlm.exit_status defines it.

torchrun exits 1 whenever a worker fails, whatever its status, so a launcher cannot tell a rank
that stopped for preemption (75) or a host that preflight rejected (69) from a crash. This runs
torchrun's public entry points in this process and maps its `ChildFailedError` (each failed
rank's exit code) with exit_status.of_ranks. A signal to the agent itself (a scheduler stopping
the job) is forwarded to the workers by torchrun, which then stop after their checkpoint: 75.
"""

from __future__ import annotations

import sys

from hanlm import exit_status


def main(argv: list[str]) -> int:
    # deferred: torch (seconds to import); `hanlm --help` lists this command without it
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run  # deferred: as above

    try:
        run(parse_args(argv))
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
    return exit_status.SUCCESS


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
