"""Whether a model's own Python code may run: `model.trust_remote_code`, off unless set.

A model whose architecture transformers does not ship names its code in `auto_map` (config.json,
tokenizer_config.json); loading it runs that code, with the user's rights. hanlm refuses such a
model unless the run's recipe sets `model.trust_remote_code = true`. The setting reaches every
loader (tokenizer, config, weights, a model built on the meta device) through this one switch,
held for the length of a stage (hanlm.pipeline) or of a command (hanlm.cli), so that no loading
call can forget it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_allowed = False


def allowed() -> bool:
    """Whether the model code named by a folder's `auto_map` may run now."""
    return _allowed


@contextmanager
def trusting(flag: bool) -> Iterator[None]:
    """Within the block, model code runs when `flag` (the recipe's model.trust_remote_code)."""
    global _allowed
    before, _allowed = _allowed, bool(flag)
    try:
        yield
    finally:
        _allowed = before


@contextmanager
def scope() -> Iterator[None]:
    """A command's scope: `allow` inside it lasts until the block ends."""
    with trusting(_allowed):
        yield


def allow(flag: bool) -> None:
    """Set the switch for the rest of the enclosing `scope` (a command that loaded its recipe)."""
    global _allowed
    _allowed = bool(flag)
