"""What `hanlm serve` answers with when a request does not say: the run's [generate] settings,
written in each engine's own request fields, and what an engine cannot do the way `hanlm
generate` does (said at start, and on the chat page)."""

from __future__ import annotations

from typing import Any

from hanlm.config import GenerateSection

LLAMA_CPP, VLLM = "llama.cpp", "vllm"
ENGINES = (LLAMA_CPP, VLLM)


def penalty_field(engine: str) -> str:
    """The request field of the CTRL repetition penalty."""
    return "repeat_penalty" if engine == LLAMA_CPP else "repetition_penalty"


def request_defaults(generate: GenerateSection, engine: str) -> dict[str, Any]:
    """The OpenAI-style request fields `generate` sets, for requests that leave them out."""
    defaults: dict[str, Any] = {
        "max_tokens": generate.max_new_tokens,
        penalty_field(engine): generate.repetition_penalty,
        "frequency_penalty": generate.frequency_penalty,
        "presence_penalty": generate.presence_penalty,
        "seed": generate.seed,
    }
    if generate.min_new_tokens:
        defaults["min_tokens"] = generate.min_new_tokens
    if generate.greedy:
        defaults["temperature"] = 0.0  # both engines take the likeliest token at 0
    else:
        everything = 0 if engine == LLAMA_CPP else -1  # "no top-k" in each engine's spelling
        defaults |= {
            "temperature": generate.temperature,
            "top_p": generate.top_p,
            "top_k": generate.top_k or everything,
        }
    return defaults


def engine_notes(generate: GenerateSection, engine: str) -> list[str]:
    """Where `engine` decodes otherwise than `hanlm generate` with the same settings."""
    notes = []
    penalised = (
        generate.repetition_penalty != 1
        or generate.frequency_penalty != 0
        or generate.presence_penalty != 0
    )
    if penalised and generate.exempt_special_tokens:
        notes.append(
            f"{engine}'s repetition penalties also lower special tokens, which hanlm generate "
            "spares: the end-of-turn token that closes every user turn is penalised, so an "
            f"answer can run on past where hanlm chat ends it ({penalty_field(engine)} 1.0 in "
            "a request, or generate.repetition_penalty = 1.0, turns that off)"
        )
    if penalised and generate.exempt_common_words:
        notes.append(f"{engine} penalises common words too (generate.exempt_common_words)")
    if generate.no_repeat_ngram_size:
        notes.append(
            f"generate.no_repeat_ngram_size = {generate.no_repeat_ngram_size} is not applied: "
            f"{engine} has no such rule"
        )
    if engine == LLAMA_CPP and (generate.frequency_penalty or generate.presence_penalty):
        notes.append(
            "llama.cpp counts the prompt's tokens in frequency and presence penalties; hanlm "
            "generate counts the answer's alone"
        )
    return notes
