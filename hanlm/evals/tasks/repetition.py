"""Repetition in generated text, measured with and without the decoding-time penalty.

Metrics over token sequences (ids, words or characters: anything hashable):

- seq-rep-n (Welleck et al. 2019, "Neural text degeneration with unlikelihood training"):
  1 - distinct n-grams / n-grams within one continuation; 0 = no n-gram repeats, near 1 = a loop.
  Averaged over continuations.
- rep/l (same paper): the share of tokens that already occurred among the previous l tokens.
  Averaged over all tokens of all continuations.
- distinct-n (Li et al. 2016): distinct n-grams / n-grams over the whole set of continuations.

`evaluate` generates from a prompt set twice, once per decoding setting, and reports the metrics
side by side.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hanlm.config import GenerateSection
from hanlm.errors import UserError
from hanlm.evals.tasks.base import Options, Task, register
from hanlm.prompts import read_prompts

NAME = "repetition"
SEQ_REP_NS = (2, 3, 4)
REP_WINDOWS = (16, 32, 128)
DISTINCT_NS = (1, 2)


def ngrams(tokens: Sequence[Hashable], n: int) -> list[tuple]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def seq_rep_n(tokens: Sequence[Hashable], n: int) -> float | None:
    """1 - unique n-grams / n-grams of one sequence; None when it has no n-gram."""
    grams = ngrams(tokens, n)
    if not grams:
        return None
    return 1.0 - len(set(grams)) / len(grams)


def rep_l_counts(tokens: Sequence[Hashable], window: int) -> tuple[int, int]:
    """(tokens that occurred in the previous `window` tokens, tokens with any predecessor)."""
    repeated = sum(1 for t in range(1, len(tokens)) if tokens[t] in tokens[max(0, t - window) : t])
    return repeated, max(len(tokens) - 1, 0)


def rep_l(sequences: Sequence[Sequence[Hashable]], window: int) -> float | None:
    repeated = total = 0
    for tokens in sequences:
        seq_repeated, seq_total = rep_l_counts(tokens, window)
        repeated, total = repeated + seq_repeated, total + seq_total
    return repeated / total if total else None


def distinct_n(sequences: Sequence[Sequence[Hashable]], n: int) -> float | None:
    """Distinct n-grams over all sequences / all n-grams; None when there is none."""
    grams = [g for tokens in sequences for g in ngrams(tokens, n)]
    return len(set(grams)) / len(grams) if grams else None


def mean_seq_rep(sequences: Sequence[Sequence[Hashable]], n: int) -> float | None:
    values = [v for v in (seq_rep_n(s, n) for s in sequences) if v is not None]
    return sum(values) / len(values) if values else None


def metrics(sequences: Sequence[Sequence[Hashable]]) -> dict[str, float | None]:
    """Every metric over a set of continuations."""
    result: dict[str, float | None] = {}
    for n in SEQ_REP_NS:
        result[f"seq_rep_{n}"] = mean_seq_rep(sequences, n)
    for window in REP_WINDOWS:
        result[f"rep_{window}"] = rep_l(sequences, window)
    for n in DISTINCT_NS:
        result[f"distinct_{n}"] = distinct_n(sequences, n)
    result["mean_length"] = sum(len(s) for s in sequences) / len(sequences) if sequences else None
    return result


# --- the task ------------------------------------------------------------------------------------


def _settings(value) -> GenerateSection:
    if isinstance(value, GenerateSection):
        return value
    return GenerateSection.model_validate(value or {})


def evaluate(
    model_dir: str | Path,
    prompts: list[str | list[dict[str, str]]],
    settings_without,
    settings_with,
    *,
    chat: bool = False,
    samples: int = 5,
) -> dict[str, Any]:
    """Generate from `prompts` with each decoding setting (GenerateSection or a dict of its
    fields) and report repetition metrics over the generated token ids side by side.

    Returns {"task", "prompts", "without": {metric: value}, "with": {...}, "delta": {with -
    without}, "settings": {...}, "samples": first `samples` prompts' answers under both}.
    """
    # deferred: torch and transformers load only when the task runs, not when tasks are listed
    from hanlm.inference import generate, load

    without, with_penalty = _settings(settings_without), _settings(settings_with)
    loaded = load(model_dir, device=with_penalty.device)
    runs = {
        "without": generate(loaded, prompts, without, chat=chat),
        "with": generate(loaded, prompts, with_penalty, chat=chat),
    }
    scores = {name: metrics([r["token_ids"] for r in results]) for name, results in runs.items()}
    delta = {
        key: (scores["with"][key] - value)
        if value is not None and scores["with"][key] is not None
        else None
        for key, value in scores["without"].items()
    }
    return {
        "task": NAME,
        "prompts": len(prompts),
        "without": scores["without"],
        "with": scores["with"],
        "delta": delta,
        "settings": {
            "without": without.model_dump(exclude={"common_words"}),
            "with": with_penalty.model_dump(exclude={"common_words"}),
        },
        "samples": [
            {"prompt": a["prompt"], "without": a["text"], "with": b["text"]}
            for a, b in list(zip(runs["without"], runs["with"], strict=True))[:samples]
        ],
    }


def markdown(result: dict[str, Any]) -> str:
    """The side-by-side table of `evaluate`'s result."""

    def cell(value) -> str:
        return "–" if value is None else f"{value:.3f}"

    lines = [
        "| metric | without penalty | with penalty | change |",
        "|---|---|---|---|",
    ]
    for key in result["without"]:
        lines.append(
            f"| {key} | {cell(result['without'][key])} | {cell(result['with'][key])} | "
            f"{cell(result['delta'][key])} |"
        )
    return "\n".join(lines) + "\n"


# --- the eval task ------------------------------------------------------------------------------

# Prompts of the default source: the opening of each demo document, continued freely.
DEFAULT_PROMPTS = 20
PROMPT_CHARS = 40


@register
class RepetitionTask(Task):
    """Free continuations of prompts, decoded greedily without and with the penalties of the
    `generate` config section; each metric reported under both (`seq_rep_4/with`, ...)."""

    name = NAME
    where_to_get = (
        'a prompts file: .jsonl rows with "prompt", or one prompt per line; in a run, '
        "the openings of the demo world's documents"
    )

    def default_source(self, demo_files: Mapping[str, Path] | None) -> str | None:
        return None if demo_files is None else str(demo_files["pretrain"])

    def load(self, source, *, demo_files, options: Options) -> list:
        source = source or self.default_source(demo_files)
        if source is None or not Path(source).is_file():
            raise UserError(
                f"repetition: prompts file {source} does not exist",
                fix=f"give --task repetition=PATH: {self.where_to_get}",
            )
        path = Path(source)
        if path.name == "pretrain.jsonl":  # demo documents: their openings
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            count = options.limit or DEFAULT_PROMPTS
            prompts = [r["text"][:PROMPT_CHARS] for r in rows if r.get("kind") != "planted"]
            prompts = prompts[:count]
        else:
            prompts = read_prompts(path)
        return [{"item_id": str(i), "prompt": p} for i, p in enumerate(prompts)]

    def evaluate(self, model, items, options: Options) -> list[dict]:
        decoding = dict(options.extra.get("generate", {}))
        # fixed-length continuations: the metrics compare like with like, and the model
        # runs where the eval runs
        decoding.update(
            greedy=True,
            max_new_tokens=options.max_new_tokens,
            min_new_tokens=options.max_new_tokens,
            device=str(model.device),
        )
        penalties_off = {
            **decoding,
            "repetition_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
        }
        result = evaluate(
            model.path,
            [item["prompt"] for item in items],
            penalties_off,
            decoding,
            samples=len(items),
        )
        self.last_result = result
        return [
            {
                "item_id": item["item_id"],
                "prompt": item["prompt"],
                "prediction": {"without": s["without"], "with": s["with"]},
                "gold": None,
                "scores": {},
            }
            for item, s in zip(items, result["samples"], strict=True)
        ]

    def aggregate(self, samples) -> dict[str, dict]:
        result = getattr(self, "last_result", None)
        if result is None:
            return {}
        out = {}
        for side in ("without", "with"):
            for key, value in result[side].items():
                if value is not None:
                    out[f"{key}/{side}"] = {"value": value, "stderr": None, "n": len(samples)}
        return out
