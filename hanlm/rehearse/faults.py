"""Whose fault a rehearsed stage's failure is: the host's (a device that cannot run the
recipe's numbers, memory that runs out, storage that fails, a NO-GO, a lost peer), the
recipe's or its inputs', or a bug in hanlm. The exit status follows (hanlm.exit_status)."""

from __future__ import annotations

from hanlm.errors import PeerLost, PreflightNoGo, Terminated, UserError
from hanlm.plan.measured import BUG, HOST, INPUT
from hanlm.train.preemption import Preempted

# a stop asked for (Ctrl-C, SIGTERM): not a stage's failure; the rehearsal ends there, as a
# run does (exit 75 or 130)
STOPS = (KeyboardInterrupt, SystemExit, Terminated, Preempted)


class HostMemory(UserError):
    """The device's memory cannot hold what the recipe asks: the host's fault (exit 69)."""


# a UserError about these keys is the device's: it cannot run what the recipe asks
DEVICE_KEYS = ("precision.mode", "precision.fp8_recipe", "parallel.device")


def classify(error: BaseException) -> tuple[str, str, str | None]:
    """(whose fault, what, the fix) of a stage's exception: the host's (a NO-GO, a lost peer,
    storage that fails, memory that runs out), the user's input, or a bug."""
    import torch  # deferred: the data stages' processes do without it

    if isinstance(error, torch.OutOfMemoryError):
        return (
            HOST,
            f"out of memory: {str(error).splitlines()[0]}",
            (
                "lower pretrain.micro_batch (or sft.micro_batch), or turn on "
                "parallel.activation_checkpointing; `hanlm rehearse --tune` times what fits"
            ),
        )
    device = isinstance(error, UserError) and error.where in DEVICE_KEYS
    if isinstance(error, (PreflightNoGo, PeerLost, HostMemory)) or device or _storage(error):
        return HOST, getattr(error, "what", str(error)), getattr(error, "fix", None)
    if isinstance(error, UserError):
        return INPUT, error.what, error.fix
    return BUG, f"{type(error).__name__}: {error}", "a bug in hanlm: report it with the traceback"


def _storage(error: BaseException) -> bool:
    from hanlm.train.checkpoint_manager import CheckpointError  # deferred: torch

    return isinstance(error, (CheckpointError, OSError))
