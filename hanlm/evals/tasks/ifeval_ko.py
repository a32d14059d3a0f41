"""IFEval in Korean: verifiable instructions checked on the model's greedy response.

Korean-aware checks: a keyword (or forbidden word) is found at the start of an eojeol and may be
followed by a particle or ending (금지어는 "사과" also matches "사과를", "사과가"); word counts
count eojeol (space-separated units); a first word matches with a particle after it. Instruction
types that depend on English letter case (change_case:*) or on English-only wording
(detectable_format:constrained_response) are skipped and counted in `skipped_instructions`.

Strict checks the response as it is; loose also accepts it with its first and/or last line
removed and with markdown asterisks removed (as IFEval's loose score). Accuracy is reported per
prompt (all its checked instructions pass) and per instruction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from hanlm.evals.tasks import Options, Task, register

SKIPPED_PREFIXES = ("change_case:", "detectable_format:constrained_response")
_BOUNDARY = r"(?<![0-9A-Za-z가-힣])"
_RELATIONS = {"less than": lambda n, k: n < k, "at least": lambda n, k: n >= k}


def eojeol(text: str) -> list[str]:
    return text.split()


def keyword_count(text: str, word: str) -> int:
    """Occurrences of `word` starting an eojeol, whatever follows it (particles, endings)."""
    return len(re.findall(_BOUNDARY + re.escape(word), text, flags=re.IGNORECASE))


def _compare(n: int, relation: str, k: int) -> bool:
    return _RELATIONS.get(relation, _RELATIONS["at least"])(n, k)


def _sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?。？！])\s+|\n+", text.strip())
    return [p for p in parts if p.strip()]


def _paragraphs_stars(text: str) -> list[str]:
    parts = re.split(r"\s?\*\*\*\s?", text)
    return [p for p in parts if p.strip()]


def _paragraphs_blank(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def _json(text: str) -> bool:
    body = text.strip().removeprefix("```json").removeprefix("```JSON").removeprefix("```")
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _hangul_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    return sum(1 for c in letters if "가" <= c <= "힣" or "ㄱ" <= c <= "ㆎ") / len(letters)


def _response_language(r: str, a: dict, prompt: str) -> bool | None:
    language = str(a.get("language", "ko")).lower()
    if language not in ("ko", "kor", "korean"):
        return None  # only Korean can be told apart without a language detector
    return _hangul_share(r) >= 0.5


def _nth_paragraph(r: str, a: dict, prompt: str) -> bool:
    paragraphs = _paragraphs_blank(r)
    want, nth = int(a["num_paragraphs"]), int(a["nth_paragraph"])
    if len(paragraphs) != want or not 1 <= nth <= len(paragraphs):
        return False
    words = eojeol(paragraphs[nth - 1])
    first = str(a.get("first_word", "")).strip()
    return bool(words) and words[0].strip("\"'“”‘’").startswith(first)


def _sections(r: str, a: dict, prompt: str) -> bool:
    splitter = str(a.get("section_spliter", "Section")).strip()
    parts = re.split(r"\s?" + re.escape(splitter) + r"\s?\d+\s?", r)
    return len(parts) - 1 >= int(a["num_sections"])


def _two_responses(r: str, a: dict, prompt: str) -> bool:
    parts = [p.strip() for p in r.split("******")]
    return len(parts) == 2 and all(parts) and parts[0] != parts[1]


CHECKERS: dict[str, Callable[[str, dict, str], bool | None]] = {
    "keywords:existence": lambda r, a, p: all(keyword_count(r, w) > 0 for w in a["keywords"]),
    "keywords:forbidden_words": lambda r, a, p: all(
        keyword_count(r, w) == 0 for w in a["forbidden_words"]
    ),
    "keywords:frequency": lambda r, a, p: _compare(
        keyword_count(r, a["keyword"]), a["relation"], int(a["frequency"])
    ),
    "keywords:letter_frequency": lambda r, a, p: _compare(
        r.lower().count(str(a["letter"]).lower()), a["let_relation"], int(a["let_frequency"])
    ),
    "language:response_language": _response_language,
    "length_constraints:number_words": lambda r, a, p: _compare(
        len(eojeol(r)), a["relation"], int(a["num_words"])
    ),
    "length_constraints:number_sentences": lambda r, a, p: _compare(
        len(_sentences(r)), a["relation"], int(a["num_sentences"])
    ),
    "length_constraints:number_paragraphs": lambda r, a, p: (
        len(_paragraphs_stars(r)) == int(a["num_paragraphs"])
    ),
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "detectable_content:number_placeholders": lambda r, a, p: (
        len(re.findall(r"\[.*?\]", r)) >= int(a["num_placeholders"])
    ),
    "detectable_content:postscript": lambda r, a, p: (
        re.search(
            r"\s*"
            + re.escape(str(a.get("postscript_marker", "P.S.")).strip()).replace(r"\ ", r"\s*"),
            r,
            flags=re.IGNORECASE | re.MULTILINE,
        )
        is not None
    ),
    "detectable_format:number_bullet_lists": lambda r, a, p: (
        len(re.findall(r"^\s*[\*\-]\s+", r, flags=re.MULTILINE)) == int(a["num_bullets"])
    ),
    "detectable_format:number_highlighted_sections": lambda r, a, p: (
        len([h for h in re.findall(r"\*[^\n\*]+\*", r) if h.strip("* ")])
        >= int(a["num_highlights"])
    ),
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": lambda r, a, p: _json(r),
    "detectable_format:title": lambda r, a, p: any(
        t.strip() for t in re.findall(r"<<([^\n]+?)>>", r)
    ),
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": lambda r, a, p: (
        r.strip().lower().startswith(str(a["prompt_to_repeat"]).strip().lower())
    ),
    "startend:end_checker": lambda r, a, p: (
        r.strip().lower().endswith(str(a["end_phrase"]).strip().lower())
    ),
    "startend:quotation": lambda r, a, p: (
        len(r.strip()) > 1 and r.strip()[0] in '"“' and r.strip()[-1] in '"”'
    ),
    "punctuation:no_comma": lambda r, a, p: "," not in r and "，" not in r,
}


def skipped(instruction_id: str) -> bool:
    return instruction_id.startswith(SKIPPED_PREFIXES) or instruction_id not in CHECKERS


def loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    first_removed = "\n".join(lines[1:]).strip()
    last_removed = "\n".join(lines[:-1]).strip()
    both_removed = "\n".join(lines[1:-1]).strip()
    variants = [response, first_removed, last_removed, both_removed]
    variants += [v.replace("*", "") for v in variants]
    return [v for v in variants if v]


def check(instruction_id: str, kwargs: dict, response: str, prompt: str) -> bool | None:
    """True/False, or None when the instruction type is skipped."""
    if skipped(instruction_id):
        return None
    kwargs = {k: v for k, v in (kwargs or {}).items() if v is not None}
    try:
        result = CHECKERS[instruction_id](response, kwargs, prompt)
    except (KeyError, ValueError, TypeError):
        return None  # arguments the checker cannot use: counted as skipped
    return None if result is None else bool(result)


def check_loose(instruction_id: str, kwargs: dict, response: str, prompt: str) -> bool | None:
    results = [check(instruction_id, kwargs, v, prompt) for v in loose_variants(response)]
    if not results or results[0] is None:
        return None
    return any(results)


def score_response(fields: dict, response: str) -> dict:
    """Per-instruction strict and loose results of one response."""
    ids, all_kwargs = fields["instruction_id_list"], fields["kwargs"]
    strict, loose, skipped_ids = [], [], []
    for i, instruction_id in enumerate(ids):
        kwargs = all_kwargs[i] if i < len(all_kwargs) and isinstance(all_kwargs[i], dict) else {}
        s = check(instruction_id, kwargs, response, fields["prompt"])
        if s is None:
            skipped_ids.append(instruction_id)
            continue
        strict.append(s)
        loose.append(bool(check_loose(instruction_id, kwargs, response, fields["prompt"])))
    return {"strict": strict, "loose": loose, "skipped": skipped_ids}


@register
class IfevalKo(Task):
    name = "ifeval_ko"
    benchmark = "ifeval_ko"
    where_to_get = "an IFEval-format Korean JSONL (key, prompt, instruction_id_list, kwargs)"

    def evaluate(self, model, items: Sequence, options: Options) -> list[dict]:
        prompts = [item.fields["prompt"] for item in items]
        if options.chat_template:
            prompts = [model.apply_chat_template(p) for p in prompts]
        outputs = model.generate(prompts, max_new_tokens=options.max_new_tokens)
        samples = []
        for item, output in zip(items, outputs, strict=True):
            result = score_response(item.fields, output)
            samples.append(
                {
                    "item_id": item.item_id,
                    "generation": output,
                    "prediction": {"strict": result["strict"], "loose": result["loose"]},
                    "gold": item.fields["instruction_id_list"],
                    "skipped": result["skipped"],
                    "scores": {},
                }
            )
        return samples

    def aggregate(self, samples: Sequence[dict]) -> dict[str, dict]:
        from hanlm.evals.tasks import mean_metric

        checked = [s for s in samples if s["prediction"]["strict"]]
        metrics = {}
        for mode in ("strict", "loose"):
            prompt_level = [float(all(s["prediction"][mode])) for s in checked]
            inst_level = [float(x) for s in checked for x in s["prediction"][mode]]
            metrics[f"prompt_level_{mode}_acc"] = mean_metric(prompt_level)
            metrics[f"inst_level_{mode}_acc"] = mean_metric(inst_level)
        n_skipped = sum(len(s["skipped"]) for s in samples)
        metrics["skipped_instructions"] = {"value": n_skipped, "stderr": None, "n": len(samples)}
        return metrics
