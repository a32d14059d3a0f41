"""What a trained model is used and shown with: [generate], [serve], [eval] and [publish]."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from hanlm.config.base import DEVICE_CHOICES, Device, Section

# Punctuation and the commonest Korean particles and endings: repeating them is grammar, not a
# loop, so the repetition penalty may spare them (generate.exempt_common_words).
COMMON_KOREAN_WORDS = [
    ".", ",", "!", "?", "'", '"', "(", ")", ":", ";", "·", "…", "-",
    "은", "는", "이", "가", "을", "를", "의", "에", "에서", "에게", "로", "으로", "와", "과",
    "도", "만", "까지", "부터", "보다", "처럼", "이다", "다", "요", "니다", "습니다", "입니다",
    "고", "며", "면", "서", "지만", "는데", "게", "지", "죠", "야",
]  # fmt: skip


class GenerateSection(Section):
    """`hanlm generate` / `hanlm chat` and generation in evals: decoding defaults."""

    max_new_tokens: int = Field(128, ge=1, le=1 << 16, description="new tokens per answer at most")
    min_new_tokens: int = Field(
        0, ge=0, description="end tokens are barred before this many (fixed-length evals)"
    )
    greedy: bool = Field(False, description="always take the likeliest token (no sampling)")
    temperature: float = Field(0.7, gt=0, le=10, description="sampling temperature")
    top_k: int = Field(50, ge=0, description="sample among the k likeliest tokens; 0 = all")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling mass; 1 = off")
    repetition_penalty: float = Field(
        1.1, gt=0, le=10, description="CTRL rule on every token already seen; 1 = off"
    )
    no_repeat_ngram_size: int = Field(0, ge=0, description="forbid repeating any n-gram; 0 = off")
    frequency_penalty: float = Field(
        0.0, ge=-2, le=2, description="subtracted per earlier occurrence in the answer (OpenAI)"
    )
    presence_penalty: float = Field(
        0.0, ge=-2, le=2, description="subtracted once if the token is already in the answer"
    )
    exempt_special_tokens: bool = Field(
        True, description="penalties never touch special tokens (the end-of-turn token stays)"
    )
    exempt_common_words: bool = Field(
        False, description="penalties also spare tokens whose text is in common_words"
    )
    common_words: list[str] = Field(
        default_factory=lambda: list(COMMON_KOREAN_WORDS),
        description="punctuation, particles and endings spared when exempt_common_words is on",
    )
    seed: int = Field(0, description="seed of sampling")
    batch_size: int = Field(8, ge=1, description="prompts decoded together")
    device: Device = Field("auto", description=DEVICE_CHOICES)


class ServeSection(Section):
    """`hanlm serve`: what one request may ask (larger is refused with a 4xx before the engine
    sees it; the message caps are nanochat's web chat's) and how the server stops."""

    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="largest request body in bytes (larger: 413)"
    )
    max_messages: int = Field(500, ge=1, description="messages in one chat request at most")
    max_message_chars: int = Field(8000, ge=1, description="characters in one message at most")
    max_total_chars: int = Field(
        32000, ge=1, description="characters of a request's messages (or prompt) together"
    )
    max_stop: int = Field(4, ge=0, description="stop strings in one request at most (OpenAI's 4)")
    max_stop_chars: int = Field(64, ge=1, description="characters in one stop string at most")
    max_logit_bias: int = Field(300, ge=0, description="logit_bias entries in one request at most")
    body_timeout_s: float = Field(
        30.0, gt=0, description="seconds a client may take to send its body (then 408)"
    )
    shutdown_s: float = Field(
        10.0, ge=0, description="on SIGTERM, seconds answers in flight get to finish"
    )


class EvalSection(Section):
    """`hanlm eval`: tasks on the run's model (or given models), scores split by contamination."""

    tasks: list[str] = Field(
        default_factory=lambda: ["demo_qa", "direction"],
        description="NAME or NAME=PATH, repeated or comma-separated (a,b); hanlm's own: "
        "kobest_boolq, kobest_copa, kobest_hellaswag, kobest_sentineg, kobest_wic, gsm8k_ko, "
        "ifeval_ko, direction, demo_qa (PATH: a file, or hf:DATASET[:CONFIG][:SPLIT]); any task "
        "or group of lm-evaluation-harness (kmmlu, haerae, click, kobest, ...; PATH: a folder "
        "holding local copies of their data sets, DIR/REPO as `hf download` writes them)",
        json_schema_extra={"cli": {"flag": "task", "aliases": ["tasks"], "metavar": "NAME[=PATH]"}},
    )
    models: list[str] = Field(
        default_factory=list,
        description="model folders (relative ones inside the run first, e.g. pretrain/hf); "
        "empty = every export of the run: pretrain/hf and sft/hf",
        json_schema_extra={"cli": {"flag": "model", "metavar": "DIR"}},
    )
    contamination: str | None = Field(
        None,
        description="decontam items.jsonl; default: RUN/decontam/items.jsonl when present",
        json_schema_extra={"cli": {"metavar": "PATH"}},
    )
    limit: int | None = Field(None, ge=1, description="first N items of each task")
    batch_size: int = Field(
        32,
        ge=1,
        description="sequences per forward pass",
        json_schema_extra={"cli": {"aliases": ["batch_size"]}},
    )
    dtype: Literal["fp32", "bf16"] = "fp32"
    device: Device = Field("auto", description=DEVICE_CHOICES)
    num_fewshot: int = Field(
        0,
        ge=0,
        le=32,
        description="worked examples in the prompt (gsm8k_ko, lm-eval's tasks; 0: the task's own)",
        json_schema_extra={"cli": {"aliases": ["num_fewshot"]}},
    )
    max_new_tokens: int = Field(256, ge=1, description="generation tasks: token limit")
    distractors: int = Field(
        4, ge=1, description="direction: wrong answers ranked with the right one"
    )
    chat_template: bool = Field(
        False,
        description="wrap the prompt in the tokenizer's chat template (generation tasks, "
        "lm-eval's tasks)",
        json_schema_extra={"cli": {"aliases": ["apply-chat-template", "apply_chat_template"]}},
    )


_HUB_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def _hub_license(value: str) -> str:
    if not _HUB_LICENSE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Hub license id: write one of "
            "huggingface.co/docs/hub/repositories-licenses in lower case, e.g. apache-2.0, mit, "
            "cc-by-4.0, or `other`"
        )
    return value


class PublishSection(Section):
    """`hanlm publish`: the model card's license and the Hub repository's visibility."""

    license: Annotated[str, AfterValidator(_hub_license)] = Field(
        "apache-2.0",
        description="the model's license on the card, a Hub license id (apache-2.0, mit, "
        "cc-by-4.0, other...); check that the training data's licenses allow it",
    )
    private: bool = Field(False, description="create the Hub repository private")
