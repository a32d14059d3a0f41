"""SIGTERM / SIGUSR1: finish the step, save synchronously, exit 75 (hanlm.exit_status.STOPPED).

Rented and cluster machines send SIGTERM (or a configured SIGUSR1) shortly before they take a
machine back. The handler only raises a flag; the training loop checks it after each step, agrees
on it over all ranks (a signal may reach only some), saves and stops.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Raised after the preemption checkpoint is committed; the CLI exits 75 (not 0: a launcher
    or `hanlm run && hanlm publish` must not take a stopped run as finished)."""


class PreemptionWatch:
    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def install(self) -> PreemptionWatch:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
