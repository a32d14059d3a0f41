"""The closure check: does the chat model end its answers?

For held-out conversations, everything before the last assistant turn is the prompt (chat
template with the generation prompt); greedy decoding (hanlm.inference's batched loop) runs until
the end-of-turn token or `max_new_tokens`. The closure rate is the share of answers that end
with the end-of-turn token. A model whose <|eot|> was never trained keeps talking to the limit.

Why an answer ends or not shows before any decoding: `end_of_answer_ranks` feeds the held-out
conversations whole (teacher forcing) and, where a reference answer ends, ranks <|eot|> among
all tokens by logit (0: greedy decoding would end there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from hanlm.errors import UserError
from hanlm.inference import generate_ids


def rate_interval(successes: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate: unlike the normal approximation it stays inside
    [0, 1] and is not empty at 0 of 50 or 50 of 50, where closure rates live."""
    if total <= 0:
        raise ValueError("a rate of nothing has no interval")
    p = successes / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * ((p * (1 - p) / total + z * z / (4 * total * total)) ** 0.5) / denominator
    # the rate itself is inside, rounding aside (at 0 of 50, centre - half is 0 give or take 1e-17)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


# An unclosed answer at least this share of whose 4-grams repeat an earlier one loops (a small
# model's digits or words over and over: the eval's seq-rep-4, hanlm.evals.tasks.repetition)
LOOP_SHARE = 0.5


def loops(ids: Sequence[int], n: int = 4) -> bool:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return bool(grams) and 1 - len(set(grams)) / len(grams) >= LOOP_SHARE


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
    """{closed, total, rate, end_token, init, max_new_tokens, examples} for greedy answers to
    the prompts (an answer is closed when it ends with `end_of_turn_id`, the template's)."""
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
                    "loops": not closed and loops(answer),
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
        "end_token": tokenizer.convert_ids_to_tokens(end_of_turn_id),
        "interval": list(rate_interval(closed, len(results))),
        "unclosed_looping": sum(r["loops"] for r in results),
        "init": init,
        "max_new_tokens": max_new_tokens,
        "examples": results[:examples],
        "unclosed_examples": [r for r in results if not r["closed"]][:examples],
    }


@torch.no_grad()
def end_of_answer_ranks(
    model, examples: Sequence[tuple[list, list]], *, end_of_turn_id: int, batch_size: int = 16
) -> dict:
    """{answers, median_rank, mean_rank, top1, mean_logprob} of <|eot|> at every trained answer
    end of `examples` ((token ids, assistant mask) per conversation, hanlm.data.chat_data's)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ranks: list[int] = []
    logprobs: list[float] = []
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        attention = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (tokens, _) in enumerate(batch):
            ids[row, : len(tokens)] = torch.as_tensor(tokens)
            attention[row, : len(tokens)] = 1
        # right padding: the positions before it see only their own conversation
        logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
        for row, (tokens, mask) in enumerate(batch):
            ends = [i for i, t in enumerate(tokens) if t == end_of_turn_id and mask[i] and i > 0]
            if not ends:
                continue
            at = logits[row, torch.as_tensor(ends, device=device) - 1].float()
            target = at[:, end_of_turn_id : end_of_turn_id + 1]
            ranks += (at > target).sum(dim=1).tolist()
            logprobs += (at.log_softmax(dim=1)[:, end_of_turn_id]).tolist()
    if was_training:
        model.train()
    if not ranks:
        raise UserError("no answer end to rank <|eot|> at", fix="give conversations with answers")
    ordered = sorted(ranks)
    return {
        "answers": len(ranks),
        "median_rank": ordered[len(ordered) // 2],
        "mean_rank": round(sum(ranks) / len(ranks), 2),
        "top1": round(sum(r == 0 for r in ranks) / len(ranks), 4),
        "mean_logprob": round(sum(logprobs) / len(logprobs), 4),
    }
