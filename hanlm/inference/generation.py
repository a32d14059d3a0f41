"""Batched generation: prompts left-padded into one batch, transformers' `generate` runs the loop.

`generate_ids` is the one loop every caller shares (hanlm generate, chat, the repetition task,
eval's generation tasks, SFT's closure check): token-id rows in, each row's new tokens out.
`generate` and `stream` add hanlm's decoding settings (the `generate` config section): its
logits processors (hanlm.inference.processors), and `generate` is told to add none of its own.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from transformers import (
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)

from hanlm.config import GenerateSection
from hanlm.console import warn
from hanlm.errors import UserError
from hanlm.inference.loading import LoadedModel, context_length
from hanlm.inference.processors import logits_processors

# --- the loop ---------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (every device's), as transformers'
    set_seed does; its module imports the Trainer's world (peft, torchao: seconds per process)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of rows padded on the left with `pad_id`: every row ends
    where generation (or the scored continuation) goes on."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids, mask


def generate_ids(
    model,
    rows: Sequence[Sequence[int]],
    *,
    pad_id: int,
    generation_config: GenerationConfig,
    **kwargs,
) -> list[list[int]]:
    """Each row's new token ids (padding after an early end included) from one `generate` call
    on the left-padded rows; `kwargs` go to `generate` (logits_processor, tokenizer, ...)."""
    ids, mask = left_padded(rows, pad_id)
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            generation_config=generation_config,
            **kwargs,
        )
    return out[:, ids.shape[1] :].tolist()


# --- prompts ----------------------------------------------------------------------------------------


def chat_prompt(loaded: LoadedModel, messages: list[dict[str, str]]) -> str:
    if not getattr(loaded.tokenizer, "chat_template", None):
        raise UserError(
            f"the model folder {loaded.path} has no chat template",
            fix="use a folder exported by hanlm (its tokenizer carries the template) or drop --chat",
        )
    return loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


class _PastContextReminder(logging.Filter):
    """Drops transformers' "friendly reminder" that a generation ran past the model's
    max_position_embeddings. hanlm lets it on purpose: a prompt keeps at least half the context
    and the answer gets the max_new_tokens asked for (a batch's left padding counts too), and
    the SFT closure check measures exactly those answers; the reminder names nothing a user can
    change. Every other record of that logger still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "exceeded the model's predefined maximum length" not in record.getMessage()


_REMINDER_LOGGER = logging.getLogger("transformers.generation.stopping_criteria")
if not any(isinstance(f, _PastContextReminder) for f in _REMINDER_LOGGER.filters):
    _REMINDER_LOGGER.addFilter(_PastContextReminder())


def prompt_budget(context: int, max_new_tokens: int) -> int:
    """How many prompt tokens fit: room is left for the answer, but a prompt always keeps at
    least half the context (an answer longer than that runs past the context, as asked)."""
    return max(context - max_new_tokens, context // 2, 1)


def prompt_ids(
    loaded: LoadedModel, texts: list[str], max_new_tokens: int, *, number_from: int | None = None
) -> list[list[int]]:
    """Token ids of the prompts. A prompt longer than the model's context loses its oldest
    tokens (the most recent ones are what the answer continues), with a warning naming it
    "prompt N" (counting from `number_from`) or, without a number, "the prompt"."""
    # verbose=False: transformers' own too-long warning; the cut and its warning happen here
    ids = loaded.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    if any(len(row) == 0 for row in ids):
        raise UserError("a prompt is empty", fix="give at least one character of prompt")
    context = context_length(loaded.model)
    if context is None:
        return ids
    budget = prompt_budget(context, max_new_tokens)
    for number, row in enumerate(ids, number_from or 0):
        if len(row) > budget:
            label = "the prompt" if number_from is None else f"prompt {number}"
            warn(
                f"{label} has {len(row):,} tokens, more than fit the model's context of "
                f"{context:,} tokens with room for the answer: its first "
                f"{len(row) - budget:,} tokens were dropped, the last {budget:,} kept"
            )
    return [row[-budget:] for row in ids]


def encode(
    loaded: LoadedModel, texts: list[str], max_new_tokens: int, *, number_from: int | None = None
) -> dict[str, torch.Tensor]:
    """`prompt_ids` left-padded: input_ids and attention_mask on the model's device."""
    ids, mask = left_padded(
        prompt_ids(loaded, texts, max_new_tokens, number_from=number_from), loaded.pad_token_id()
    )
    return {"input_ids": ids.to(loaded.device), "attention_mask": mask.to(loaded.device)}


def _prompt_texts(
    loaded: LoadedModel, prompts: list[str | list[dict[str, str]]], chat: bool
) -> list[str]:
    texts = []
    for number, prompt in enumerate(prompts, 1):
        if not prompt:
            raise UserError(f"prompt {number} is empty", fix="give every prompt some text")
        if isinstance(prompt, list):
            texts.append(chat_prompt(loaded, prompt))
        elif chat:
            texts.append(chat_prompt(loaded, [{"role": "user", "content": prompt}]))
        else:
            texts.append(prompt)
    return texts


# --- hanlm's decoding -------------------------------------------------------------------------------


class StopFlag(StoppingCriteria):
    """Stops generation when set from another thread (Ctrl-C in chat)."""

    def __init__(self):
        self.event = threading.Event()

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


def decoding_kwargs(loaded: LoadedModel, settings: GenerateSection, prompt_length: int) -> dict:
    """`generate`'s generation_config and logits_processor for the decoding settings."""
    # Neutral values: generate adds no processor of its own; ours come in logits_processor.
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=settings.min_new_tokens or None,
        do_sample=not settings.greedy,
        temperature=1.0,
        top_k=0 if not settings.greedy else 50,
        top_p=1.0,
        eos_token_id=loaded.end_token_ids(),
        pad_token_id=loaded.pad_token_id(),
    )
    return {
        "generation_config": config,
        "logits_processor": logits_processors(
            settings, loaded.tokenizer, loaded.vocab_size, prompt_length
        ),
    }


def _finish(loaded: LoadedModel, new_ids: list[int], max_new_tokens: int) -> dict:
    ends = set(loaded.end_token_ids())
    pad = loaded.pad_token_id()
    cut = next((i for i, t in enumerate(new_ids) if t in ends), None)
    tokens = new_ids[:cut] if cut is not None else [t for t in new_ids if t != pad]
    reason = "stop" if cut is not None else "length" if len(new_ids) >= max_new_tokens else "stop"
    return {
        "text": loaded.tokenizer.decode(tokens, skip_special_tokens=True),
        "token_ids": tokens,
        "new_tokens": len(tokens) + (1 if cut is not None else 0),
        "finish_reason": reason,
    }


def generate(
    loaded: LoadedModel,
    prompts: list[str | list[dict[str, str]]],
    settings: GenerateSection,
    *,
    chat: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Generate one answer per prompt, `settings.batch_size` at a time.

    A prompt is text, or a conversation (list of {role, content}) which always goes through the
    chat template; with `chat`, text prompts are wrapped as one user turn. Each result holds the
    prompt, the answer text and token ids (end token excluded) and why it stopped."""
    if not prompts:
        raise UserError("no prompt given", fix="give --prompt TEXT or --prompts FILE")
    seed_everything(settings.seed)
    texts = _prompt_texts(loaded, prompts, chat)
    results = []
    for start in range(0, len(texts), settings.batch_size):
        chunk = texts[start : start + settings.batch_size]
        number_from = start + 1 if len(texts) > 1 else None
        rows = prompt_ids(loaded, chunk, settings.max_new_tokens, number_from=number_from)
        prompt_length = max(len(row) for row in rows)
        kwargs = decoding_kwargs(loaded, settings, prompt_length)
        new = generate_ids(loaded.model, rows, pad_id=loaded.pad_token_id(), **kwargs)
        for i, row in enumerate(new):
            result = _finish(loaded, row, settings.max_new_tokens)
            results.append({"prompt": prompts[start + i], **result})
        if progress is not None:
            progress(len(chunk))
    return results


def stream(
    loaded: LoadedModel,
    prompt_text: str,
    settings: GenerateSection,
    *,
    stop: StopFlag | None = None,
) -> Iterator[str]:
    """Yield the answer's text piece by piece as the model writes it (one prompt)."""
    batch = encode(loaded, [prompt_text], settings.max_new_tokens)
    streamer = TextIteratorStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    kwargs = decoding_kwargs(loaded, settings, batch["input_ids"].shape[1])
    if stop is not None:
        kwargs["stopping_criteria"] = StoppingCriteriaList([stop])
    failure: list[BaseException] = []

    def work() -> None:
        try:
            with torch.inference_mode():
                loaded.model.generate(**batch, **kwargs, streamer=streamer)
        except BaseException as e:  # surfaced in the caller's thread below
            failure.append(e)
            streamer.end()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    yield from streamer
    thread.join()
    if failure:
        raise failure[0]
