"""SFT's data: the conversations checked against the run's benchmark index, the held-out
conversations the closure check asks (seeded, every repeat of them out of training too), and
the token rows training reads, with the data report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hanlm import inference
from hanlm.config import SftSection
from hanlm.console import warn
from hanlm.data import chat_data
from hanlm.data.chat_sources import REPEAT
from hanlm.errors import UserError

if TYPE_CHECKING:
    from hanlm.data.decontam.index import BenchmarkIndex

HELDOUT_SEED = 8  # a stream of its own: the split does not move when other settings do


def decontaminate(conversations: list[dict], index: BenchmarkIndex | None, sft_cfg: SftSection):
    """(kept conversations, report): those holding an item of the run's benchmark index (its
    decontam stage's) are dropped or refused."""
    if index is None:
        return conversations, {"checked": False, "reason": "the run has no decontam index"}
    kept, dropped = [], []
    for conversation in conversations:
        text = chat_data.conversation_text(conversation["messages"])
        hits = index.matches(text, min_coverage=sft_cfg.contamination_coverage)
        if hits:
            dropped.append({"id": conversation["id"], "items": hits})
        else:
            kept.append(conversation)
    if dropped and sft_cfg.contaminated == "fail":
        first = dropped[0]
        raise UserError(
            f"{len(dropped)} SFT conversations hold benchmark items (first: {first['id']} holds "
            f"{first['items'][0]['benchmark']} item {first['items'][0]['item_id']})",
            fix="remove them from the data, or set sft.contaminated = drop to drop them",
        )
    if dropped:
        warn(f"sft: dropped {len(dropped)} conversations holding benchmark items")
    return kept, {"checked": True, "dropped": len(dropped), "conversations": dropped}


def split_heldout(conversations: list[dict], count: int, seed: int) -> tuple[list, list]:
    """(train, held out): `count` conversations held out for the closure check, and every
    repeat of them (a mix's `ID#repeat2`, ...) out of training too: it never saw what it is asked."""
    base = [c["id"].split(REPEAT, 1)[0] for c in conversations]
    distinct = list(dict.fromkeys(base))
    if len(distinct) < 2:
        raise UserError(
            f"SFT needs at least 2 conversations, the data has {len(distinct)}",
            fix="give more conversations",
        )
    count = min(count, len(distinct) // 2)
    order = np.random.default_rng([seed, HELDOUT_SEED]).permutation(len(distinct))
    held = {distinct[i] for i in order[:count].tolist()}
    train = [c for c, b in zip(conversations, base, strict=True) if b not in held]
    heldout = [c for c, b in zip(conversations, base, strict=True) if b in held and b == c["id"]]
    return train, heldout


def load_tokenizer(tokenizer_dir: Path):
    """The checked tokenizer folder's tokenizer (hanlm.inference), which must carry a chat
    template."""
    tok = inference.load_tokenizer(tokenizer_dir)
    if not tok.chat_template:
        raise UserError(
            f"the tokenizer in {tokenizer_dir} has no chat template",
            fix="use a hanlm tokenizer (its tokenizer_config.json carries the template)",
        )
    return tok


def chat_rows(tokenizer, train, heldout, sft_cfg: SftSection, eot: int, pad: int):
    def encode(conversations):
        return [chat_data.tokenize(tokenizer, c["messages"], eot) for c in conversations]

    train_ids, train_mask, train_positions, too_long = chat_data.build_rows(
        encode(train), sft_cfg.seq_len, pad, packing=sft_cfg.packing
    )
    held_encoded = encode(heldout)
    held_ids, held_mask, held_positions, held_too_long = chat_data.build_rows(
        held_encoded, sft_cfg.seq_len, pad, packing=sft_cfg.packing
    )
    # The closure check asks only what the model could have learned: conversations that fit.
    fitting = [
        c
        for c, (ids, _) in zip(heldout, held_encoded, strict=True)
        if len(ids) <= sft_cfg.seq_len + 1
    ]
    if len(train_ids) == 0:
        raise UserError(
            f"every training conversation is longer than sft.seq_len + 1 = {sft_cfg.seq_len + 1} tokens",
            fix="raise sft.seq_len",
        )
    report = {
        "conversations": len(train) + len(heldout),
        "train_conversations": len(train),
        "heldout_conversations": len(heldout),
        "too_long_dropped": too_long + held_too_long,
        "train_rows": len(train_ids),
        "trained_tokens": int(train_mask[:, 1:].sum()),
        "packing": sft_cfg.packing,
    }
    if too_long:
        warn(
            f"sft: {too_long} conversations longer than {sft_cfg.seq_len + 1} tokens were left out"
        )
    if not fitting:
        raise UserError(
            f"no held-out conversation fits sft.seq_len + 1 = {sft_cfg.seq_len + 1} tokens",
            fix="raise sft.seq_len or sft.heldout",
        )
    report["closure_prompts"] = len(fitting)
    rows = {
        "train": (train_ids, train_mask, train_positions),
        "heldout": (held_ids, held_mask, held_positions),
    }
    return rows, report, fitting
