"""Which process of a launch this one is, from what torchrun sets in each rank's environment
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE). hanlm reads those variables here and nowhere
else; a process started on its own is rank 0 of 1."""

from __future__ import annotations

import os

# what torchrun sets for each rank (and TORCHELASTIC_*): a process that starts a command which
# is not one of its launch's ranks (a server, a launch of its own) leaves them out
LAUNCH_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


def rank() -> int:
    """This process's rank among all of its launch's."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """Its rank among this host's: the GPU it takes."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def node_of(rank_here: int) -> int:
    """The host (torchrun's agent) number of this process, whose rank is `rank_here`."""
    if "GROUP_RANK" in os.environ:
        return int(os.environ["GROUP_RANK"])
    return rank_here // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def local_world_size() -> int:
    """Ranks on this host (the whole world when torchrun did not say)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size())))


def is_main() -> bool:
    """Rank 0: the process that writes what one process writes for all."""
    return rank() == 0


def launched() -> bool:
    """Started by torchrun (or a launcher that sets RANK as it does)."""
    return "RANK" in os.environ


def without_launch(env: dict[str, str]) -> dict[str, str]:
    """`env` less what torchrun set: for a command that is not one of this launch's ranks."""
    return {
        k: v
        for k, v in env.items()
        if k not in LAUNCH_VARIABLES and not k.startswith("TORCHELASTIC_")
    }
