"""The one exception type for a user's mistake (and its kind for a host preflight rejects), and
the stop a SIGTERM asks for."""

from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """Bad input from the user: the CLI prints the message without a traceback and exits 2.

    The message says what went wrong, where (file, line, key), and how to fix it.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.message)

    def __reduce__(self):  # crosses process boundaries whole (data engine workers)
        return _rebuild_user_error, (self.what, self.where, self.fix)

    @property
    def message(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.where:
            parts.append(f"Where: {self.where}.")
        if self.fix:
            parts.append(f"Fix: {self.fix.rstrip('.')}.")
        return " ".join(parts)


class PreflightNoGo(UserError):
    """The measured hosts cannot run the planned training (hanlm.preflight): the CLI exits with
    hanlm.exit_status.HOST_REJECTED, which launchers take as "try another host"."""

    def __reduce__(self):
        return _rebuild_no_go, (self.what, self.where, self.fix)


class PeerLost(UserError):
    """A peer process or host stopped during training (hanlm.train.peers names it): the CLI
    exits with hanlm.exit_status.STOPPED, since the last committed checkpoint resumes the run."""


def _rebuild_no_go(what: str, where: str | None, fix: str | None) -> PreflightNoGo:
    return PreflightNoGo(what, where=where, fix=fix)


def _rebuild_user_error(what: str, where: str | None, fix: str | None) -> UserError:
    return UserError(what, where=where, fix=fix)


class Terminated(BaseException):
    """SIGTERM outside training (which saves and stops on its own): stop like Ctrl-C does."""


_deferring = 0
_pending = False


def stop_on_sigterm() -> None:
    """What the SIGTERM handler raises: Terminated now, or, inside `sigterm_deferred`, when the
    block ends (an exception raised while a pool forks lands in an at-fork callback, which
    Python ignores with a lock still taken, and the unwinding hangs)."""
    global _pending
    if _deferring:
        _pending = True
        return
    raise Terminated


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """A block a SIGTERM must not interrupt (forking a pool); it stops right after instead."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending:
            _pending = False
            raise Terminated
