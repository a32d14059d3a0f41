"""Decoding: load any Hugging Face causal LM folder and generate with repetition control.

transformers' `generate` runs the loop and its processors do the work where they exist
(repetition penalty, no-repeat n-grams, temperature, top-k, top-p). What they lack is written
here: a repetition penalty that spares special tokens (so the end-of-turn token is never pushed
down because the prompt already holds one) and, optionally, punctuation and Korean particles and
endings; OpenAI-style frequency and presence penalties.

The processor list is built here in one fixed order (penalties on raw logits, then temperature,
then top-k / top-p) and `generate` is told to add none of its own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hanlm.config import GenerateSection
from hanlm.errors import UserError

END_OF_TURN = "<|eot|>"


# --- processors transformers lacks -----------------------------------------------------------------


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


# --- loading ---------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}", fix="use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but no CUDA GPU is available", fix="use cpu")
    return device


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    path: Path

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def end_token_ids(self) -> list[int]:
        """Tokens that end an answer: the model's eos ids, the tokenizer's eos and <|eot|>."""
        ids: list[int] = []
        eos = self.model.generation_config.eos_token_id
        ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        eot = self.tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if isinstance(eot, int) and eot != self.tokenizer.unk_token_id:
            ids.append(eot)
        return sorted(set(ids))

    def pad_token_id(self) -> int:
        if self.tokenizer.pad_token_id is not None:
            return self.tokenizer.pad_token_id
        return self.end_token_ids()[0]


def load(model_dir: str | Path, device: str = "auto") -> LoadedModel:
    """A model folder (config.json, weights, tokenizer) ready for inference; never runs code
    from the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hanlm.model_folder import TOKENIZER_FIX, check_model_folder

    path = check_model_folder(model_dir)
    torch_device = resolve_device(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load a tokenizer from {path}: {e}", fix=TOKENIZER_FIX) from None
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, trust_remote_code=False, use_safetensors=True
        )
    except (OSError, ValueError) as e:
        raise UserError(
            f"cannot load a causal language model from {path}: {e}",
            fix="give a folder holding a decoder-only model's config.json and weights",
        ) from None
    tokenizer.padding_side = "left"  # batches end where generation continues
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out: any token will do
    return LoadedModel(model.to(torch_device).eval(), tokenizer, path)


# --- prompts ---------------------------------------------------------------------------------------


def chat_prompt(loaded: LoadedModel, messages: list[dict[str, str]]) -> str:
    if not getattr(loaded.tokenizer, "chat_template", None):
        raise UserError(
            f"the model folder {loaded.path} has no chat template",
            fix="use a folder exported by hanlm (its tokenizer carries the template) or drop --chat",
        )
    return loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def read_prompts(path: str | Path) -> list[str | list[dict[str, str]]]:
    """Prompts from a file: .jsonl rows with "prompt" (text) or "messages" (a conversation),
    otherwise one prompt per non-empty line."""
    path = Path(path)
    layout = (
        'a text file with one prompt per line, or a .jsonl file with "prompt" or "messages" '
        "on each line"
    )
    if not path.is_file():
        raise UserError(f"prompts file {path} does not exist", fix=f"give {layout}")
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(
            f"prompts file {path} is not UTF-8 text (byte {e.start})", fix=f"give {layout}"
        ) from None
    if path.suffix != ".jsonl":
        prompts = [line for line in lines if line.strip()]
    else:
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(
                    f"invalid JSON: {e.msg}", where=f"{path}:{number}", fix=f"give {layout}"
                ) from None
            value = row.get("messages", row.get("prompt")) if isinstance(row, dict) else None
            if not (isinstance(value, str) or _is_conversation(value)):
                raise UserError(
                    'a row needs "prompt" (a string) or "messages" (a list of {role, content})',
                    where=f"{path}:{number}",
                    fix=f"give {layout}",
                )
            prompts.append(value)
    if not prompts:
        raise UserError(f"prompts file {path} holds no prompt", fix=f"give {layout}")
    return prompts


def _is_conversation(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )


# --- generation ------------------------------------------------------------------------------------


class StopFlag(StoppingCriteria):
    """Stops generation when set from another thread (Ctrl-C in chat)."""

    def __init__(self):
        self.event = threading.Event()

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


def _generate_kwargs(loaded: LoadedModel, settings: GenerateSection, prompt_length: int) -> dict:
    from transformers import GenerationConfig

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


def context_length(model) -> int | None:
    """The most positions the model was built for (None when its config does not say)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config or model.config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prompt_budget(context: int, max_new_tokens: int) -> int:
    """How many prompt tokens fit: room is left for the answer, but a prompt always keeps at
    least half the context (an answer longer than that runs past the context, as asked)."""
    return max(context - max_new_tokens, context // 2, 1)


def encode(
    loaded: LoadedModel, texts: list[str], max_new_tokens: int, *, number_from: int | None = None
) -> dict[str, torch.Tensor]:
    """Left-padded token ids of the prompts. A prompt longer than the model's context loses
    its oldest tokens (the most recent ones are what the answer continues), with a warning
    naming it "prompt N" (counting from `number_from`) or, without a number, "the prompt"."""
    from hanlm.console import warn

    # verbose=False: transformers' own too-long warning; the cut and its warning happen here
    ids = loaded.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    if any(len(row) == 0 for row in ids):
        raise UserError("a prompt is empty", fix="give at least one character of prompt")
    context = context_length(loaded.model)
    if context is not None:
        budget = prompt_budget(context, max_new_tokens)
        for number, row in enumerate(ids, number_from or 0):
            if len(row) > budget:
                label = "the prompt" if number_from is None else f"prompt {number}"
                warn(
                    f"{label} has {len(row):,} tokens, more than fit the model's context of "
                    f"{context:,} tokens with room for the answer: its first "
                    f"{len(row) - budget:,} tokens were dropped, the last {budget:,} kept"
                )
        ids = [row[-budget:] for row in ids]
    batch = loaded.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    return batch.to(loaded.device)


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
    from transformers import set_seed

    if not prompts:
        raise UserError("no prompt given", fix="give --prompt TEXT or --prompts FILE")
    set_seed(settings.seed)
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
    results = []
    for start in range(0, len(texts), settings.batch_size):
        chunk = texts[start : start + settings.batch_size]
        number_from = start + 1 if len(texts) > 1 else None
        batch = encode(loaded, chunk, settings.max_new_tokens, number_from=number_from)
        prompt_length = batch["input_ids"].shape[1]
        with torch.inference_mode():
            out = loaded.model.generate(
                **batch, **_generate_kwargs(loaded, settings, prompt_length)
            )
        for i, row in enumerate(out[:, prompt_length:].tolist()):
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
    from transformers import TextIteratorStreamer

    batch = encode(loaded, [prompt_text], settings.max_new_tokens)
    streamer = TextIteratorStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    kwargs = _generate_kwargs(loaded, settings, batch["input_ids"].shape[1])
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


def write_results(path: str | Path, results: list[dict]) -> Path:
    """The results as JSONL (prompt, text, token_ids, new_tokens, finish_reason), atomically."""
    from hanlm.files import atomic_write_text

    lines = [json.dumps(r, ensure_ascii=False) for r in results]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return Path(path)
