"""The chat template of a tokenizer hanlm did not make: its special tokens, read from the template
itself, and the assistant tokens to train on where it has no `{% generation %}` block.

Special tokens. hanlm's own tokenizers list theirs in special_tokens.json; another model's
(a Qwen2's ChatML: `<|im_start|>role\\n...<|im_end|>\\n`) says them only through its template. The
template is rendered on a probe conversation (a system, a user and an assistant turn of known
text): the special token that opens each turn's header is that role's token, the first special
token after the assistant's text is the end of turn. The end of a document is the tokenizer's
eos token, padding its pad token (else the end of a document: padding is masked out of every
loss), bos its bos token where it has one. The result has special_tokens.json's shape, so the
audit, the initialisation, the closure check and the export read it alike. Its reference rows
for the audit (hanlm's are its reserved tokens, which text never holds) are the tokenizer's
other special tokens, those the template does not use: rows no chat ever trains either.

Assistant tokens. Without a generation block, `apply_chat_template`'s assistant mask is empty.
The conversation is then rendered turn by turn: the tokens an assistant turn adds to the
rendering of the turns before it, less the generation prompt (its header), are that turn's
answer and its end of turn, and exactly those are trained. A template whose renderings are not
prefixes of each other (one that rewrites earlier turns) cannot be masked so, and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hanlm.errors import UserError

PROBE = {
    "system": "\u2460 system probe \u2460",
    "user": "\u2461 user probe \u2461",
    "assistant": "\u2462 assistant probe \u2462",
}
GENERATION_BLOCK = "{% generation %}"


def has_generation_block(template: str | None) -> bool:
    return bool(template) and "generation" in template and "endgeneration" in template


def _special_tokens(tokenizer) -> dict[str, int]:
    """Every special token of the tokenizer (its added tokens marked special and its named
    ones), by text."""
    found = {str(t.content): i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for token in tokenizer.all_special_tokens:
        found.setdefault(token, tokenizer.convert_tokens_to_ids(token))
    return found


def special_tokens_of(tokenizer, where: str) -> dict:
    """special_tokens.json's content for a tokenizer with a chat template of its own tokens."""
    template = tokenizer.chat_template
    if not template:
        raise UserError(
            f"the tokenizer in {where} has no chat template",
            fix="give a chat model's folder, or a base model whose tokenizer carries a template",
        )
    probe = dict(PROBE)
    try:
        rendered = _render(tokenizer, probe)
    except Exception:  # a template without a system role (Gemma's): the other two turns
        del probe["system"]
        try:
            rendered = _render(tokenizer, probe)
        except Exception as e:
            raise UserError(
                f"the chat template of {where} cannot render a user and an assistant turn "
                f"({type(e).__name__}: {e})",
                where=f"{where}/tokenizer_config.json chat_template",
            ) from None
    specials = _special_tokens(tokenizer)
    out: dict = {}
    position = 0
    for role, text in probe.items():
        start = rendered.find(text, position)
        if start < 0:
            raise UserError(
                f"the chat template of {where} does not render the {role} turn's text as given",
                where=f"{where}/tokenizer_config.json chat_template",
            )
        header = rendered[position:start]
        opening = _last_special(header, specials)
        if opening is None:
            raise UserError(
                f"the chat template of {where} opens the {role} turn with no special token "
                f"({header!r})",
                fix="SFT needs a template whose turns are marked by special tokens",
            )
        out[role] = {"token": opening, "id": specials[opening]}
        position = start + len(text)
    closing = _first_special(rendered[position:], specials)
    if closing is None:
        raise UserError(
            f"the chat template of {where} ends the assistant's turn with no special token",
            fix="SFT trains the model to end its answers on a special token: give a template "
            "that ends each turn with one",
        )
    out["eot"] = {"token": closing, "id": specials[closing]}
    eos = tokenizer.eos_token
    if eos is None:
        raise UserError(f"the tokenizer in {where} has no eos token")
    out["eod"] = {"token": eos, "id": tokenizer.eos_token_id}
    pad = tokenizer.pad_token or eos
    out["pad"] = {"token": pad, "id": tokenizer.convert_tokens_to_ids(pad)}
    if tokenizer.bos_token is not None:
        out["bos"] = {"token": tokenizer.bos_token, "id": tokenizer.bos_token_id}
    used = {v["token"] for v in out.values()}
    out["reserved"] = [
        {"token": token, "id": i} for token, i in sorted(specials.items(), key=lambda kv: kv[1])
        if token not in used
    ]  # fmt: skip
    out["vocab_size"] = len(tokenizer)
    out["reference"] = (
        "the tokenizer's special tokens the chat template does not use: no chat trains their "
        "rows (hanlm's own tokenizers reserve such tokens for this)"
    )
    return out


def _render(tokenizer, probe: Mapping[str, str]) -> str:
    messages = [{"role": role, "content": text} for role, text in probe.items()]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _last_special(text: str, specials: Mapping[str, int]) -> str | None:
    best, at = None, -1
    for token in specials:
        where = text.rfind(token)
        if where > at or (where == at and best is not None and len(token) > len(best)):
            best, at = token, where
    return best if at >= 0 else None


def _first_special(text: str, specials: Mapping[str, int]) -> str | None:
    best, at = None, len(text) + 1
    for token in specials:
        where = text.find(token)
        if 0 <= where < at or (where == at and best is not None and len(token) > len(best)):
            best, at = token, where
    return best if at <= len(text) else None


def tokenize_by_turns(
    tokenizer, messages: Sequence[Mapping], end_of_turn_id: int
) -> tuple[list[int], list[int]]:
    """(token ids, assistant mask) of a conversation through a template without a generation
    block: each assistant turn's tokens are those it adds to the rendering before it, after
    the generation prompt, up to and with its end-of-turn token (what follows it, a newline
    between turns, is the template's, not the answer)."""

    def ids(turns, prompt: bool = False) -> list[int]:
        return list(tokenizer.apply_chat_template(
            list(turns), tokenize=True, add_generation_prompt=prompt, return_dict=False))  # fmt: skip

    whole = ids(messages)
    mask = [0] * len(whole)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = ids(messages[:k], prompt=True), ids(messages[: k + 1])
        if whole[: len(after)] != after or after[: len(before)] != before:
            raise UserError(
                "the chat template renders a conversation differently from its first turns "
                "(it rewrites earlier turns), so the assistant's tokens cannot be told apart",
                where="tokenizer_config.json chat_template",
                fix="put each assistant answer inside {% generation %} ... {% endgeneration %}",
            )
        added = after[len(before) :]
        end = added.index(end_of_turn_id) + 1 if end_of_turn_id in added else len(added)
        for i in range(len(before), len(before) + end):
            mask[i] = 1
    return whole, mask
