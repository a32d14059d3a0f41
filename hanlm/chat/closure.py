"""The closure check: does the chat model end its answers?

For held-out conversations, everything before the last assistant turn is the prompt (chat
template with the generation prompt); greedy decoding with transformers' `generate` runs until
the end-of-turn token or `max_new_tokens`. The closure rate is the share of answers that end
with the end-of-turn token. A model whose <|eot|> was never trained keeps talking to the limit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hanlm.errors import UserError


def prompt_of(messages: Sequence[dict]) -> tuple[list[dict], str]:
    """(messages before the last assistant turn, that turn's reference answer)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return list(messages[:last]), messages[last]["content"]


@torch.no_grad()
def check(
    model,
    tokenizer,
    conversations: Sequence[dict],
    *,
    end_of_turn_id: int,
    pad_id: int,
    max_new_tokens: int,
    batch_size: int = 16,
    examples: int = 5,
    init: str | None = None,
) -> dict:
    """{closed, total, rate, init, max_new_tokens, examples} for greedy answers to the prompts."""
    from transformers import GenerationConfig

    if not conversations:
        raise UserError("the closure check has no held-out conversations", fix="raise sft.heldout")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=end_of_turn_id,
        pad_token_id=pad_id,
    )
    results = []
    for start in range(0, len(conversations), batch_size):
        batch = conversations[start : start + batch_size]
        prompts = [prompt_of(c["messages"]) for c in batch]
        encoded = [
            list(
                tokenizer.apply_chat_template(
                    p, tokenize=True, add_generation_prompt=True, return_dict=True
                )["input_ids"]
            )
            for p, _ in prompts
        ]
        width = max(len(e) for e in encoded)
        # left padding: every prompt ends where generation starts
        input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
        )
        for row, (conversation, (messages, reference)) in enumerate(
            zip(batch, prompts, strict=True)
        ):
            new = output[row, width:].tolist()
            closed = end_of_turn_id in new
            answer = new[: new.index(end_of_turn_id)] if closed else new
            answer = [t for t in answer if t != pad_id]
            results.append(
                {
                    "id": conversation.get("id"),
                    "prompt": messages[-1]["content"] if messages else "",
                    "answer": tokenizer.decode(answer, skip_special_tokens=False),
                    "reference": reference,
                    "closed": closed,
                    "new_tokens": len(answer) + int(closed),
                }
            )
    if was_training:
        model.train()
    closed = sum(r["closed"] for r in results)
    return {
        "closed": closed,
        "total": len(results),
        "rate": closed / len(results),
        "init": init,
        "max_new_tokens": max_new_tokens,
        "examples": results[:examples],
    }
