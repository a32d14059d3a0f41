"""The processes below a launcher (torchrun agents and their workers) and the rank of each,
read from /proc: what the multi-host tests signal or kill; and a free port for their
rendezvous."""

from __future__ import annotations

import socket
from pathlib import Path

from hanlm.launch.torchrun import processes_below


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens at now (a rendezvous for the test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_of(pid: int) -> int | None:
    """The global rank torchrun gave process `pid` (RANK in its environment), or None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in env:
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def ranks_below(pid: int) -> dict[int, int]:
    """rank -> PID of the training processes below `pid` (a worker's own children excluded:
    they inherit its RANK)."""
    found: dict[int, int] = {}
    for child in processes_below(pid):
        rank = rank_of(child)
        if rank is not None and rank not in found:
            found[rank] = child
    return found
