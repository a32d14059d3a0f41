"""IFEval in Korean: verifiable instructions checked on the model's greedy response.

The checkers follow lm-evaluation-harness's IFEval (`lm_eval/tasks/ifeval`) wherever the language
does not matter, so a response without Hangul scores as lm-eval scores it, strict and loose
(`benchmarks/ifeval_agreement.py` measures it, `tests/unit/test_ifeval_agreement.py` keeps it). That
includes lm-eval's own conventions: an empty response follows nothing; paragraphs for
`nth_paragraph_first_word` are split on exactly two newlines and its first word is matched
whole, ignoring case and trailing punctuation; every line starting with `-` or `*` (but not `**`)
is a bullet, `---` included; `**x**` counts as a highlight; "P. S." is a "P.S."; a closing `"`
is ignored by `end_checker`; English keywords count anywhere ("apple" in "pineapple"), forbidden
words only whole ("apples" is not "apple"); English words are `\\w+` runs ("don't" is 2).

Deliberate differences, Korean first:

- A Korean keyword (one with Hangul) is found at the start of an eojeol, whatever follows it
  (particles, endings): "사과" is found in "사과를", "사과가", but not in "풋사과". lm-eval finds a
  keyword anywhere ("풋사과" counts) and a forbidden word only between `\\b`s, which never
  matches before a particle ("사과를" passes a ban on "사과": Hangul is a word character).
- An English forbidden word followed directly by a particle ("AI는") is found; lm-eval's `\\b`
  misses it.
- An eojeol with Hangul is one word ("AI(인공지능)는", "3.5%로": 1 each; lm-eval counts 3 and 2);
  an eojeol without Hangul counts its `\\w+` runs, as lm-eval.
- `nth_paragraph_first_word` accepts a particle or ending after a Korean first word ("그래서는"
  for "그래서"; a typographic quote before it too) and a particle after an English one ("AI는"
  for "AI"); lm-eval wants the exact word.
- `letter_frequency` counts a Hangul letter ("가"); lm-eval replaces a letter outside a-z with a
  random one, so it cannot be compared.
- `language:response_language` is checked for Korean only: Korean when at least half of the
  eojeol with letters have Hangul, so Korean with English terms ("GPU 메모리를 줄이려면 gradient
  checkpointing을 쓰세요.") is Korean; langdetect, which lm-eval uses, calls such text German,
  Estonian or Vietnamese. A response without letters counts as followed (as lm-eval). Other
  languages need a language detector and are skipped.
- `startend:quotation` also accepts typographic quotes “…”; `punctuation:no_comma` also rejects
  the full-width comma "，". lm-eval knows only the ASCII characters.
- Keywords, forbidden words, section splitters and postscript markers are literal text; lm-eval
  reads them as regular expressions ("a.m." matches "alma" there).

Instruction types that depend on English letter case (change_case:*) or on English-only wording
(detectable_format:constrained_response) are skipped and counted in `skipped_instructions`.
`length_constraints:number_sentences` splits at . ! ? (and their full-width forms) followed by
space, and at line breaks; lm-eval uses nltk's English punkt model, whose data no PyPI package
ships, so this type is not compared.

Strict checks the response as it is; loose also accepts it with its first and/or last line
removed and with markdown asterisks removed (as IFEval's loose score). Accuracy is reported per
prompt (all its checked instructions pass) and per instruction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from hanlm.evals.tasks.base import Options, Task, mean_metric, register
from hanlm.testsets.readers import WHERE_TO_GET

SKIPPED_PREFIXES = ("change_case:", "detectable_format:constrained_response")
_BOUNDARY = r"(?<![0-9A-Za-z가-힣])"
_HANGUL = re.compile(r"[가-힣ㄱ-ㆎ]")
_RELATIONS = {"less than": lambda n, k: n < k, "at least": lambda n, k: n >= k}


def has_hangul(text: str) -> bool:
    return _HANGUL.search(text) is not None


def eojeol(text: str) -> list[str]:
    return text.split()


def count_words(text: str) -> int:
    """An eojeol with Hangul is one word; other text counts its `\\w+` runs (as IFEval)."""
    return sum(1 if has_hangul(t) else len(re.findall(r"\w+", t)) for t in eojeol(text))


def keyword_count(text: str, word: str) -> int:
    """A Korean keyword: occurrences starting an eojeol, whatever follows (particles, endings).
    Any other keyword: occurrences anywhere, ignoring case (as IFEval)."""
    pattern = (_BOUNDARY if has_hangul(word) else "") + re.escape(word)
    return len(re.findall(pattern, text, flags=re.IGNORECASE))


def forbidden_found(text: str, word: str) -> bool:
    """A Korean word as `keyword_count`; any other as a whole word (IFEval's `\\b`), also when
    a Korean particle follows it ("AI는")."""
    if has_hangul(word):
        return keyword_count(text, word) > 0
    pattern = r"\b" + re.escape(word) + r"(?:\b|(?=[가-힣]))"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def _compare(count: int, relation: str, target: int) -> bool:
    return _RELATIONS.get(relation, _RELATIONS["at least"])(count, target)


def _sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?。？！])\s+|\n+", text.strip())
    return [p for p in parts if p.strip()]


def _number_paragraphs(response: str, kwargs: dict, prompt: str) -> bool:
    """Parts between `***` dividers; an empty part is allowed only at either end."""
    parts = re.split(r"\s?\*\*\*\s?", response)
    if any(not p.strip() for p in parts[1:-1]):
        return False
    return sum(1 for p in parts if p.strip()) == int(kwargs["num_paragraphs"])


def _json(text: str) -> bool:
    body = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        body = body.removeprefix(fence)
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def korean_share(text: str) -> float | None:
    """The share of eojeol with letters that contain Hangul; None when none has letters."""
    worded = [t for t in eojeol(text) if any(c.isalpha() for c in t)]
    if not worded:
        return None
    return sum(has_hangul(t) for t in worded) / len(worded)


def _response_language(response: str, kwargs: dict, prompt: str) -> bool | None:
    language = str(kwargs.get("language", "ko")).lower()
    if language not in ("ko", "kor", "korean"):
        return None  # only Korean can be told apart without a language detector
    share = korean_share(response)
    return share is None or share >= 0.5  # no letters: nothing to judge, followed (as IFEval)


def _nth_paragraph(response: str, kwargs: dict, prompt: str) -> bool:
    """Paragraphs are split on exactly two newlines; the nth part must be non-empty."""
    parts = response.split("\n\n")
    count = sum(1 for p in parts if p.strip())
    want, nth = int(kwargs["num_paragraphs"]), int(kwargs["nth_paragraph"])
    if count != want or not 1 <= nth <= count:
        return False
    paragraph = parts[nth - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].lower()
    first = str(kwargs.get("first_word", "")).lower()
    if has_hangul(first):  # the word with any particle or ending after it
        return word.lstrip("\"'“‘").startswith(first.strip())
    word = re.split(r"[.,?!'\"]", word.lstrip("'").lstrip('"'), maxsplit=1)[0]
    # the exact word (as IFEval), or the word with a Korean particle after it ("AI는")
    return word == first or (
        bool(first) and word.startswith(first) and has_hangul(word[len(first) : len(first) + 1])
    )


def _sections(response: str, kwargs: dict, prompt: str) -> bool:
    splitter = str(kwargs.get("section_spliter", "Section")).strip()
    parts = re.split(r"\s?" + re.escape(splitter) + r"\s?\d+\s?", response)
    return len(parts) - 1 >= int(kwargs["num_sections"])


def _postscript(response: str, kwargs: dict, prompt: str) -> bool:
    marker = str(kwargs.get("postscript_marker", "P.S.")).strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
    return re.search(pattern, response.lower(), flags=re.MULTILINE) is not None


def _bullets(response: str, kwargs: dict, prompt: str) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", response, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", response, flags=re.MULTILINE)
    return len(stars) + len(dashes) == int(kwargs["num_bullets"])


def _highlights(response: str, kwargs: dict, prompt: str) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", response) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", response) if h[2:-2].strip()]
    return len(single) + len(double) >= int(kwargs["num_highlights"])


def _title(response: str, kwargs: dict, prompt: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", response))


def _two_responses(response: str, kwargs: dict, prompt: str) -> bool:
    """Two different non-empty responses split by `******`; an empty part only at either end."""
    parts = response.split("******")
    if any(not p.strip() for p in parts[1:-1]):
        return False
    answers = [p.strip() for p in parts if p.strip()]
    return len(answers) == 2 and answers[0] != answers[1]


def _quotation(response: str, kwargs: dict, prompt: str) -> bool:
    response = response.strip()
    return len(response) > 1 and (response[0], response[-1]) in (('"', '"'), ("“", "”"))


CHECKERS: dict[str, Callable[[str, dict, str], bool | None]] = {
    "keywords:existence": lambda r, a, p: all(keyword_count(r, w) > 0 for w in a["keywords"]),
    "keywords:forbidden_words": lambda r, a, p: (
        not any(forbidden_found(r, w) for w in a["forbidden_words"])
    ),
    "keywords:frequency": lambda r, a, p: _compare(
        keyword_count(r, str(a["keyword"]).strip()), a["relation"], int(a["frequency"])
    ),
    "keywords:letter_frequency": lambda r, a, p: _compare(
        r.lower().count(str(a["letter"]).strip().lower()),
        a["let_relation"],
        int(a["let_frequency"]),
    ),
    "language:response_language": _response_language,
    "length_constraints:number_words": lambda r, a, p: _compare(
        count_words(r), a["relation"], int(a["num_words"])
    ),
    "length_constraints:number_sentences": lambda r, a, p: _compare(
        len(_sentences(r)), a["relation"], int(a["num_sentences"])
    ),
    "length_constraints:number_paragraphs": _number_paragraphs,
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "detectable_content:number_placeholders": lambda r, a, p: (
        len(re.findall(r"\[.*?\]", r)) >= int(a["num_placeholders"])
    ),
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _bullets,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": lambda r, a, p: _json(r),
    "detectable_format:title": _title,
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": lambda r, a, p: (
        r.strip().lower().startswith(str(a["prompt_to_repeat"]).strip().lower())
    ),
    "startend:end_checker": lambda r, a, p: (
        r.strip().strip('"').lower().endswith(str(a["end_phrase"]).strip().lower())
    ),
    "startend:quotation": _quotation,
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
    return [v for v in variants if v.strip()]


def check(instruction_id: str, kwargs: dict, response: str, prompt: str) -> bool | None:
    """True/False, or None when the instruction type is skipped. An empty response follows
    no instruction (as IFEval)."""
    if skipped(instruction_id):
        return None
    kwargs = {k: v for k, v in (kwargs or {}).items() if v is not None}
    try:
        result = CHECKERS[instruction_id](response, kwargs, prompt)
    except (KeyError, ValueError, TypeError):
        return None  # arguments the checker cannot use: counted as skipped
    return None if result is None else bool(result) and bool(response.strip())


def check_loose(instruction_id: str, kwargs: dict, response: str, prompt: str) -> bool | None:
    results = [check(instruction_id, kwargs, v, prompt) for v in loose_variants(response)]
    if not results:
        return check(instruction_id, kwargs, response, prompt)  # empty: False, or None
    if results[0] is None:
        return None
    return any(results)


def score_response(fields: dict, response: str) -> dict:
    """Per-instruction strict and loose results of one response."""
    ids, all_kwargs = fields["instruction_id_list"], fields["kwargs"]
    strict, loose, skipped_ids = [], [], []
    for i, instruction_id in enumerate(ids):
        kwargs = all_kwargs[i] if i < len(all_kwargs) and isinstance(all_kwargs[i], dict) else {}
        followed = check(instruction_id, kwargs, response, fields["prompt"])
        if followed is None:
            skipped_ids.append(instruction_id)
            continue
        strict.append(followed)
        loose.append(bool(check_loose(instruction_id, kwargs, response, fields["prompt"])))
    return {"strict": strict, "loose": loose, "skipped": skipped_ids}


@register
class IfevalKo(Task):
    name = "ifeval_ko"
    benchmark = "ifeval_ko"
    where_to_get = WHERE_TO_GET["ifeval_ko"]

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
