"""hanlm.ranks: which process of a launch this one is, read from torchrun's variables in one
place only."""

from __future__ import annotations

import ast
from pathlib import Path

from hanlm import ranks

PACKAGE = Path(ranks.__file__).parent


def test_a_process_alone_is_rank_0_of_1(monkeypatch):
    for name in ranks.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert (ranks.rank(), ranks.local_rank(), ranks.world_size()) == (0, 0, 1)
    assert ranks.is_main() and not ranks.launched() and ranks.local_world_size() == 1


def test_torchruns_variables_say_the_rank_host_and_world(monkeypatch):
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GROUP_RANK", raising=False)
    assert (ranks.rank(), ranks.local_rank(), ranks.world_size()) == (5, 1, 8)
    assert not ranks.is_main() and ranks.launched() and ranks.local_world_size() == 4
    assert ranks.node_of(5) == 1
    monkeypatch.setenv("GROUP_RANK", "3")
    assert ranks.node_of(5) == 3
    child = ranks.without_launch({**env, "TORCHELASTIC_RUN_ID": "x", "PATH": "/bin"})
    assert child == {"PATH": "/bin"}


def test_no_other_module_reads_the_launch_variables():
    """A string constant naming one of them anywhere else in hanlm is a read of its own."""
    names = set(ranks.LAUNCH_VARIABLES) - {"MASTER_ADDR", "MASTER_PORT"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == Path(ranks.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value}")
    assert not found, found
