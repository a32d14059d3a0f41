"""The closure check: does the chat model end its answers?

For held-out conversations, everything before the last assistant turn is the prompt (chat
template with the generation prompt); greedy decoding (hanlm.inference's batched loop) runs until
the end-of-turn token or `max_new_tokens`. The closure rate is the share of answers that end
with the end-of-turn token. A model whose <|eot|> was never trained keeps talking to the limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import GenerationConfig

from hanlm.errors import UserError
from hanlm.inference import generate_ids


def prompt_of(messages: Sequence[dict]) -> tuple[list[dict], str]:
    """(messages before the last assistant turn, that turn's reference answer)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return list(messages[:last]), messages[last]["content"]


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
    if not conversations:
        raise UserError("the closure check has no held-out conversations", fix="raise sft.heldout")
    was_training = model.training
    model.eval()
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
        answers = generate_ids(model, encoded, pad_id=pad_id, generation_config=config)
        for conversation, (messages, reference), new in zip(batch, prompts, answers, strict=True):
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
