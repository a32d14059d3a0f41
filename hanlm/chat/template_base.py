"""A base model whose tokenizer has no chat template gets hanlm's (hanlm.chat_template).

Its four tokens (`<|system|>`, `<|user|>`, `<|assistant|>`, `<|eot|>`) are added to the tokenizer
as special tokens where it lacks them, the template is set, and the input embedding (and an
untied output head) grows to hold them where it has no spare rows. The new rows start as the
model's own initialisation makes them (transformers' `_init_weights`, seeded), not as a mean of
the others: untrained, exactly as a template token's rows are in a model pretrained without
chats. `sft.init` then gives them their start, and the audit and the closure check see what they
see on a model hanlm pretrained. The result is an ordinary model folder with a template whose
`{% generation %}` block marks the assistant's tokens; SFT reads it like any other, and the
export carries the grown vocabulary and hanlm's template.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken

from hanlm import remote_code
from hanlm.chat_template import ASSISTANT, CHAT_TEMPLATE, END_OF_TURN, SYSTEM, USER
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, read_json

TEMPLATE_TOKENS = (SYSTEM, USER, ASSISTANT, END_OF_TURN)
RECORD = "hanlm_template_base.json"  # written last: the folder is whole when it is there
WAIT_S = 1800.0  # how long another rank waits for rank 0 to write the folder


@dataclass(frozen=True)
class Added:
    """What adding the template did to the model."""

    tokens: tuple[str, ...]  # the template's tokens the tokenizer lacked
    rows_before: int  # the embedding's rows before
    rows_after: int

    def line(self) -> str:
        grown = (
            f"embedding grown from {self.rows_before:,} to {self.rows_after:,} rows"
            if self.rows_after > self.rows_before
            else f"in spare rows of its {self.rows_before:,}"
        )
        return (
            f"the base model has no chat template: hanlm's added, {len(self.tokens)} new tokens "
            f"({', '.join(self.tokens)}) {grown}, their rows untrained until sft.init"
        )


def has_template(tokenizer) -> bool:
    return bool(tokenizer.chat_template)


def check_can_add(tokenizer, where: str) -> None:
    """A tokenizer that cannot take the template: one with no end-of-text token (documents and
    padding need it), refused before any work."""
    if tokenizer.eos_token is None:
        raise UserError(
            f"the tokenizer in {where} has no chat template and no eos token: hanlm's template "
            "can be added, but SFT needs the end of a document",
            where=where,
            fix="give a base model whose tokenizer names its eos_token (tokenizer_config.json)",
        )


def add_template(source: Path, out: Path, *, seed: int) -> Added:
    """Write `out`: the model and tokenizer of `source` with hanlm's template and its tokens."""
    # deferred: torch and transformers load only when a base model needs the template
    import torch
    from transformers import AutoModelForCausalLM

    from hanlm.inference import load_tokenizer  # deferred: transformers, as above

    tokenizer = load_tokenizer(source)
    check_can_add(tokenizer, str(source))
    vocab = tokenizer.get_vocab()
    new = tuple(t for t in TEMPLATE_TOKENS if t not in vocab)
    if new:
        tokenizer.add_tokens([AddedToken(t, special=True) for t in new], special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(
        source,
        trust_remote_code=remote_code.allowed(),
        local_files_only=True,
        dtype="auto",
    )
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        torch.manual_seed(seed)  # the new rows' initialisation, the same on every run
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    added = Added(new, rows, model.get_input_embeddings().weight.shape[0])
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    atomic_write_json(
        partial / RECORD,
        {"source": str(source), "added": list(new), "rows_before": rows,
         "rows_after": added.rows_after},
    )  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)
    return added


def read_added(out: Path) -> Added | None:
    """What `add_template` wrote in `out`, or None when the folder is not whole."""
    record = out / RECORD
    if not record.is_file():
        return None
    data = read_json(record)
    return Added(tuple(data["added"]), data["rows_before"], data["rows_after"])


def wait_for(out: Path, *, timeout_s: float = WAIT_S) -> Added:
    """On a rank other than 0: the folder rank 0 writes, once it is whole."""
    deadline = time.monotonic() + timeout_s
    while (added := read_added(out)) is None:
        if time.monotonic() > deadline:
            raise UserError(
                f"rank 0 did not write the templated base model in {out} within {timeout_s:.0f} s",
                fix="see rank 0's output",
            )
        time.sleep(0.5)
    return added
