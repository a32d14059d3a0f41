"""Who the other ranks are, and which of them is gone when a collective fails.

At start every rank opens a small listening socket (a daemon thread accepts and hangs up) and
the ranks exchange (rank, node, host, socket address). When training then fails with a
collective error (gloo notices a closed connection at once; a hung or unplugged host shows up as
the process group's timeout, `parallel.timeout_s`), each surviving rank knocks on every peer's
socket: refused means that process is gone, no answer within a few seconds means its host is
unreachable. The error becomes a `PeerLost` that names those ranks, their node (torchrun's
agent, one per host) and host, instead of a backend stack trace.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

from hanlm import ranks
from hanlm.errors import PeerLost, UserError

KNOCK_TIMEOUT_S = 3.0
RETRY_AFTER_S = 2.0

_listener: socket.socket | None = None  # kept open for the life of the process group


@dataclass(frozen=True)
class Peer:
    rank: int
    node: int  # torchrun's GROUP_RANK: one agent, normally one host
    host: str
    address: tuple[str, int]  # the listening socket a survivor knocks on

    def describe(self) -> str:
        return f"rank {self.rank} on host {self.host} (node {self.node})"


def _local_address() -> str:
    """The address of the interface that reaches the rendezvous host: the one peers can reach
    this host at (no packet is sent: connecting a UDP socket only picks the route)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, 9))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def listen() -> socket.socket:
    """A socket on every interface that answers knocks: a daemon thread accepts and hangs up,
    so that the backlog never fills however often peers knock. Closing it ends the thread."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("", 0))
    listener.listen(128)

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            conn.close()

    threading.Thread(target=answer, name="hanlm-peer-knock", daemon=True).start()
    return listener


def exchange(rank: int, world_size: int) -> tuple[Peer, ...]:
    """Open this rank's socket and learn every rank's (a collective: all ranks call it)."""
    global _listener
    close()
    _listener = listen()
    port = _listener.getsockname()[1]
    # peers are told the address of the interface that faces them
    mine = Peer(rank, ranks.node_of(rank), socket.gethostname(), (_local_address(), port))
    roster: list[Peer | None] = [None] * world_size
    dist.all_gather_object(roster, mine)
    return tuple(roster)  # type: ignore[arg-type]


def close() -> None:
    global _listener
    if _listener is not None:
        with contextlib.suppress(OSError):  # wakes the thread blocked in accept (Linux)
            _listener.shutdown(socket.SHUT_RDWR)
        _listener.close()
        _listener = None


def knock(peer: Peer, timeout_s: float = KNOCK_TIMEOUT_S) -> str | None:
    """None when the peer's process still answers, else why it does not."""
    try:
        with socket.create_connection(peer.address, timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "its process is gone"
    except TimeoutError:
        return f"its host did not answer in {timeout_s:g} s"
    except OSError as e:
        return f"its host is unreachable ({e.strerror or e})"


def lost(roster: tuple[Peer, ...], me: int) -> list[tuple[Peer, str]]:
    """The peers that no longer answer, with the reason, knocked on all at once."""
    others = [p for p in roster if p.rank != me]
    if not others:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(32, len(others))) as pool:
        answers = list(pool.map(knock, others))
    return [(p, why) for p, why in zip(others, answers, strict=True) if why is not None]


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def explain(error: BaseException, roster: tuple[Peer, ...], me: int) -> PeerLost | None:
    """A PeerLost naming the peers that are gone when `error` came from losing them, else None
    (every peer still answers: the error is something else and stands as it is)."""
    if len(roster) < 2 or isinstance(error, UserError):
        return None
    gone = lost(roster, me)
    if not gone:  # a peer that failed may still be on its way out: ask once more
        time.sleep(RETRY_AFTER_S)
        gone = lost(roster, me)
    if not gone:
        return None
    names = "; ".join(f"{p.describe()}: {why}" for p, why in gone)
    here = roster[me]
    return PeerLost(
        f"lost {len(gone)} of {len(roster)} ranks: {names} "
        f"(rank {here.rank} on host {here.host} saw: {_last_line(error)})",
        fix="find out why it stopped (out of memory, preempted, rebooted, network), then start "
        "the same torchrun command on every host again: training resumes from the last "
        "committed checkpoint",
    )
