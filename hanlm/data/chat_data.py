"""Chat SFT data: messages JSONL read and checked, tokenised with the chat template, batched.

A line is `{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}` (an
`id` is kept when present). Tokenisation is the tokenizer's own chat template through
`apply_chat_template(..., return_assistant_tokens_mask=True)`: the template's `{% generation %}`
block marks each assistant answer and its end-of-turn token, and exactly those positions are
labels; system and user text, role headers and padding are IGNORE.

Rows hold `seq_len + 1` tokens (inputs are the first `seq_len`, labels the last `seq_len`). With
packing, whole conversations are placed one after another in a row while they fit; otherwise
each conversation has a row of its own, right-padded with <|pad|> (causal attention: padding
after the text cannot change the text's logits). A conversation longer than a row is dropped,
never cut: a cut answer would lose its end-of-turn token. Packed conversations do not see each
other: a packed row's positions restart at 0 with each conversation (the padding continues the
last one's), and the batches of such rows carry them as the model's `position_ids`
(hanlm.data.packing), so each conversation is trained exactly as if it were alone in its row.

`ChatLoader` has the `TokenLoader` contract the trainer uses: next_batch(), eval_batches(),
state_dict() / load_state_dict() with a seeded per-epoch order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hanlm.chat import foreign
from hanlm.chat_template import ASSISTANT, END_OF_TURN, SYSTEM, USER
from hanlm.data import packing as packing_lib
from hanlm.data.loader import position_state
from hanlm.errors import UserError

IGNORE = -100
ROLES = ("system", "user", "assistant")
STATE_VERSION = 1
# Text that would tokenise into the template's own tokens and forge a turn boundary.
TEMPLATE_MARKERS = (SYSTEM, USER, ASSISTANT, END_OF_TURN, "<|endoftext|>", "<|pad|>")


# --- reading --------------------------------------------------------------------------------------


def _line_error(path: Path, line: int, what: str) -> UserError:
    return UserError(
        what,
        where=f"{path}:{line}",
        fix='write one JSON object per line: {"messages": [{"role": "user", "content": "..."}, '
        '{"role": "assistant", "content": "..."}]} with roles system, user, assistant',
    )


def check_messages(messages: Any, path: Path, line: int) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise _line_error(path, line, "the conversation has no messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _line_error(path, line, f"message {i} is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _line_error(path, line, f"message {i} has unknown role {role!r}")
        if not isinstance(content, str):
            raise _line_error(path, line, f"message {i} has no text content")
        marker = next((t for t in TEMPLATE_MARKERS if t in content), None)
        if marker is not None:
            raise _line_error(path, line, f"message {i} contains the template token {marker}")
    if not any(m["role"] == "assistant" for m in messages):
        raise _line_error(path, line, "the conversation has no assistant turn to learn from")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_conversations(path: Path) -> list[dict]:
    """[{"id", "messages"}] of a messages JSONL file; a UserError names the first bad line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"chat data file {path} does not exist",
            fix="give --data a messages JSONL file (or run the corpus stage on `demo` first)",
        )
    conversations = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _line_error(path, number, "the line is not UTF-8 text") from None
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise _line_error(path, number, f"not valid JSON ({e.msg})") from None
            if isinstance(row, list):  # a bare list of messages is a conversation too
                row = {"messages": row}
            if not isinstance(row, dict):
                raise _line_error(path, number, "the line is not a JSON object")
            messages = check_messages(row.get("messages"), path, number)
            conversations.append({"id": str(row.get("id", f"line-{number}")), "messages": messages})
    if not conversations:
        raise UserError(f"chat data file {path} holds no conversations", fix="give it some")
    return conversations


def conversation_text(messages: Sequence[Mapping]) -> str:
    """The words of a conversation, for the benchmark check."""
    return "\n".join(m["content"] for m in messages)


# --- tokenising -----------------------------------------------------------------------------------


def tokenize(tokenizer, messages: Sequence[Mapping], end_of_turn_id: int) -> tuple[list, list]:
    """(token ids, assistant mask) of one conversation through the chat template.

    Checked: every assistant turn's end-of-turn token is in the mask and no other end-of-turn
    is, so no user or system token is ever trained on.
    """
    if foreign.has_generation_block(tokenizer.chat_template):
        out = tokenizer.apply_chat_template(
            list(messages),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    else:  # another model's template: the assistant's tokens, turn by turn
        ids, mask = foreign.tokenize_by_turns(tokenizer, messages, end_of_turn_id)
    turns = sum(m["role"] == "assistant" for m in messages)
    ends = [i for i, t in enumerate(ids) if t == end_of_turn_id]
    trained_ends = sum(mask[i] for i in ends)
    if trained_ends != turns or len(ends) != len(messages):
        raise UserError(
            f"the chat template marks {trained_ends} end-of-turn tokens for training in a "
            f"conversation with {turns} assistant turns",
            where="tokenizer_config.json chat_template",
            fix="put each assistant answer and its end-of-turn token inside {% generation %} "
            "(hanlm.chat_template.CHAT_TEMPLATE does)",
        )
    return ids, mask


def build_rows(
    examples: Sequence[tuple[list, list]], seq_len: int, pad_id: int, *, packing: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(ids, mask) arrays of shape (rows, seq_len + 1), the rows' per-conversation positions
    (packing; None without it: a row holds one conversation), and how many examples were too
    long."""
    width = seq_len + 1
    rows: list[tuple[list, list, list]] = []  # ids, mask, where each conversation starts
    too_long = 0
    current: tuple[list, list, list] = ([], [], [])
    for ids, mask in examples:
        if len(ids) > width:
            too_long += 1
            continue
        if not packing or len(current[0]) + len(ids) > width:
            if current[0]:
                rows.append(current)
            current = ([], [], [])
        current[2].append(len(current[0]))
        current[0].extend(ids)
        current[1].extend(mask)
    if current[0]:
        rows.append(current)
    out_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    out_mask = np.zeros((len(rows), width), dtype=np.bool_)
    starts = np.zeros((len(rows), width), dtype=np.bool_)
    for r, (ids, mask, row_starts) in enumerate(rows):
        out_ids[r, : len(ids)] = ids
        out_mask[r, : len(mask)] = np.asarray(mask, dtype=bool)
        starts[r, row_starts] = True
    positions = packing_lib.positions_from_starts(starts) if packing else None
    return out_ids, out_mask, positions, too_long


def labels_of(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of rows: labels are the next tokens where the mask trains them."""
    inputs = ids[:, :-1]
    labels = np.where(mask[:, 1:], ids[:, 1:], IGNORE)
    return inputs, labels


# --- the loader -----------------------------------------------------------------------------------


class ChatLoader:
    """Batches of (inputs, labels) int64 tensors (micro_batch, seq_len) for one rank, and, when
    rows are packed, the model's `position_ids` as a third item (see hanlm.data.packing).

    Same order and state rules as `TokenLoader`: a seeded permutation per epoch, one global
    step of micro_batch x world_size rows per `next_batch()`, the epoch's remainder dropped.
    """

    def __init__(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray | None = None,
        *,
        micro_batch: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ):
        if positions is not None and positions.shape != ids.shape:
            raise ValueError(f"positions of shape {positions.shape} for rows of {ids.shape}")
        self.inputs, self.labels = labels_of(ids, mask)
        # the inputs' per-conversation positions (packed rows), None for one conversation a row
        self.positions = None if positions is None else positions[:, :-1]
        self.micro_batch, self.rank, self.world_size = micro_batch, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        if len(self.inputs) < self.samples_per_step:
            raise UserError(
                f"the chat data makes {len(self.inputs)} rows, but one step needs micro_batch x "
                f"ranks = {self.samples_per_step}",
                fix="give more conversations or lower sft.micro_batch",
            )
        digest = hashlib.sha256(self.inputs.tobytes() + self.labels.tobytes()).hexdigest()
        self.fingerprint = digest[:16]
        self._epoch = 0
        self._consumed = 0

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.world_size

    @property
    def rows(self) -> int:
        return len(self.inputs)

    @property
    def trained_tokens(self) -> int:
        return int((self.labels != IGNORE).sum())

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.rows)

    def _batch(self, rows: np.ndarray):
        import torch  # deferred: the data package imports without torch (tokenizer, shards)

        batch = (
            torch.from_numpy(np.ascontiguousarray(self.inputs[rows])),
            torch.from_numpy(np.ascontiguousarray(self.labels[rows])),
        )
        if self.positions is None:
            return batch
        extra = packing_lib.extra_model_inputs(self.positions[rows])
        if not extra:
            return batch
        return (*batch, {k: torch.from_numpy(v) for k, v in extra.items()})

    def next_batch(self):
        if self._consumed + self.samples_per_step > self.rows:
            self._epoch += 1
            self._consumed = 0
        start = self._consumed + self.rank * self.micro_batch
        rows = self._order(self._epoch)[start : start + self.micro_batch]
        self._consumed += self.samples_per_step
        return self._batch(rows)

    def eval_batches(self, max_batches: int | None = None) -> Iterator:
        steps = self.rows // self.samples_per_step
        if max_batches is not None:
            steps = min(steps, max_batches)
        for step in range(steps):
            start = step * self.samples_per_step + self.rank * self.micro_batch
            yield self._batch(np.arange(start, start + self.micro_batch))

    def state_dict(self) -> dict[str, Any]:
        return position_state(
            STATE_VERSION, self.fingerprint, self.seed, self._epoch, self._consumed
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("fingerprint") != self.fingerprint:
            raise UserError(
                "the chat data or its tokenisation changed since the SFT checkpoint was saved",
                where="the data-loader state in the checkpoint",
                fix="resume with the same data and settings, or rerun with --force",
            )
        if state.get("seed") != self.seed:
            raise UserError(
                f"the SFT checkpoint was saved with data seed {state.get('seed')}, "
                f"this run uses {self.seed}",
                fix=f"set run.seed = {state.get('seed')} or rerun with --force",
            )
        self._epoch, self._consumed = int(state["epoch"]), int(state["consumed"])
