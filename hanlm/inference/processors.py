"""hanlm's logits processors: the repetition control transformers lacks, in one fixed order.

transformers' processors do the work where they exist (repetition penalty, no-repeat n-grams,
temperature, top-k, top-p). What they lack is written here: a repetition penalty that spares
special tokens (so the end-of-turn token is never pushed down because the prompt already holds
one) and, optionally, punctuation and Korean particles and endings; OpenAI-style frequency and
presence penalties. `logits_processors` builds the list: penalties on raw logits, then
temperature, then top-k / top-p.
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hanlm.config import GenerateSection


class SparingRepetitionPenalty(LogitsProcessor):
    """transformers' CTRL repetition penalty, with the `exempt_ids` columns left as they were."""

    def __init__(self, penalty: float, exempt_ids: torch.Tensor):
        self.inner = RepetitionPenaltyLogitsProcessor(float(penalty))
        self.exempt_ids = exempt_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        exempt = self.exempt_ids.to(scores.device)
        kept = scores[:, exempt].clone()
        penalised = self.inner(input_ids, scores)
        penalised[:, exempt] = kept
        return penalised


class FrequencyPresencePenalty(LogitsProcessor):
    """OpenAI's rule on the answer so far: logit -= frequency * count + presence * (count > 0).

    Counts only tokens generated after `prompt_length` (the prompt is the user's, not a
    repetition); `exempt_ids` are never penalised.
    """

    def __init__(
        self, frequency: float, presence: float, prompt_length: int, exempt_ids: torch.Tensor
    ):
        self.frequency, self.presence = float(frequency), float(presence)
        self.prompt_length = prompt_length
        self.exempt_ids = exempt_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_length :]
        vocab = scores.shape[-1]
        # one spare column absorbs ids beyond the head's width (they cannot be generated)
        counts = torch.zeros(scores.shape[0], vocab + 1, device=scores.device, dtype=scores.dtype)
        counts.scatter_add_(
            1, generated.clamp(max=vocab), torch.ones_like(generated, dtype=scores.dtype)
        )
        counts = counts[:, :vocab]
        counts[:, self.exempt_ids.to(scores.device)] = 0
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def exempt_token_ids(tokenizer, settings: GenerateSection, vocab_size: int) -> torch.Tensor:
    """Ids the penalties spare: special tokens (by default) and, optionally, every token whose
    decoded text, stripped of spaces, is one of `settings.common_words`."""
    key = (
        vocab_size,
        settings.exempt_special_tokens,
        settings.exempt_common_words and tuple(settings.common_words),
    )
    # kept on the tokenizer: decoding a whole vocabulary once per batch would be waste
    cache = tokenizer.__dict__.setdefault("_hanlm_exempt_ids", {})
    if key not in cache:
        cache[key] = _exempt_token_ids(tokenizer, settings, vocab_size)
    return cache[key]


def _exempt_token_ids(tokenizer, settings: GenerateSection, vocab_size: int) -> torch.Tensor:
    ids: set[int] = set()
    if settings.exempt_special_tokens:
        ids.update(tokenizer.all_special_ids)
        ids.update(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
    if settings.exempt_common_words and settings.common_words:
        words = set(settings.common_words)
        n = min(vocab_size, len(tokenizer))
        texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
        ids.update(i for i, text in enumerate(texts) if text.strip() in words)
    return torch.tensor(sorted(i for i in ids if 0 <= i < vocab_size), dtype=torch.long)


def logits_processors(
    settings: GenerateSection, tokenizer, vocab_size: int, prompt_length: int
) -> LogitsProcessorList:
    """Penalties on the raw logits first, then temperature, top-k and top-p when sampling."""
    exempt = exempt_token_ids(tokenizer, settings, vocab_size)
    processors = LogitsProcessorList()
    if settings.repetition_penalty != 1.0:
        processors.append(SparingRepetitionPenalty(settings.repetition_penalty, exempt))
    if settings.frequency_penalty or settings.presence_penalty:
        processors.append(
            FrequencyPresencePenalty(
                settings.frequency_penalty, settings.presence_penalty, prompt_length, exempt
            )
        )
    if settings.no_repeat_ngram_size > 0:
        processors.append(NoRepeatNGramLogitsProcessor(settings.no_repeat_ngram_size))
    if not settings.greedy:
        if settings.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_k > 0:
            processors.append(TopKLogitsWarper(settings.top_k))
        if settings.top_p < 1.0:
            processors.append(TopPLogitsWarper(settings.top_p))
    return processors
