"""Whether every host sees the same checkpoint folder.

A checkpoint is one folder that every rank writes its shards into and rank 0 commits (manifest,
rename, `latest`); a host that has its own folder at that path (a local disk, a run folder copied
to each host) saves shards nobody commits and cannot resume. So one rank per host (torchrun's
node, GROUP_RANK) writes a token file named after a nonce and its node into the folder (or its
nearest existing parent, where it will be created), all wait, and each looks for every node's
token, for a few seconds (a network file system may show new files late); then each removes
its own. With a single host it passes trivially.

Every rank calls `probe` (it runs collectives); local errors are reported, never raised, so that
no rank leaves the others waiting.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import torch.distributed as torch_dist

from hanlm import ranks
from hanlm.preflight.storage import existing_parent
from hanlm.train.parallel import Dist

TOKEN_PREFIX = ".hanlm-preflight-shared-"  # the storage test's scratch prefix: never left behind
WAIT_S = 5.0


def _token(folder: Path, nonce: str, node: int) -> Path:
    return folder / f"{TOKEN_PREFIX}{nonce}-node{node}"


def _seen(folder: Path, nonce: str, nodes: list[int], wait_s: float) -> list[int]:
    """The nodes whose token this host sees, waiting up to `wait_s` for all of them."""
    deadline = time.monotonic() + wait_s
    while True:
        seen = [n for n in nodes if _token(folder, nonce, n).is_file()]
        if len(seen) == len(nodes) or time.monotonic() >= deadline:
            return seen
        time.sleep(0.2)


def probe(dist: Dist, folder: Path, *, wait_s: float = WAIT_S) -> dict | None:
    """On one rank per host: {"node", "host", "probe_dir", "nodes", "seen"} (or "error");
    None on the other ranks."""
    node = ranks.node_of(dist.rank)
    writer = dist.local_rank == 0
    nonce = [uuid.uuid4().hex if dist.rank == 0 else None]
    torch_dist.broadcast_object_list(nonce, src=0)  # one name for this run, unlike any earlier one
    nodes: list[int | None] = [None] * dist.world_size
    torch_dist.all_gather_object(nodes, node)
    all_nodes = sorted(set(nodes))  # type: ignore[type-var]

    probe_dir = existing_parent(folder)
    result = {"node": node, "host": socket.gethostname(), "probe_dir": str(probe_dir)}
    token = _token(probe_dir, nonce[0], node)
    if writer:
        try:
            token.write_text(f"{socket.gethostname()}\n")
        except OSError as e:
            result["error"] = f"cannot write {token.name} in {probe_dir}: {e.strerror or e}"
    torch_dist.barrier()  # every host has written its token (or failed to)
    if writer and "error" not in result:
        result.update(nodes=all_nodes, seen=_seen(probe_dir, nonce[0], all_nodes, wait_s))
    torch_dist.barrier()  # every host has looked: the tokens can go
    if writer:
        token.unlink(missing_ok=True)
    return result if writer else None
