"""GSM8K in Korean: greedy generation, 0-shot or k-shot, answers extracted two ways.

`strict` takes the number after `#### ` (the GSM8K answer format), `flexible` the last number in
the generation. Both compare with the target after removing commas, currency signs and a
trailing period. The k worked examples are the first k items of the data, which are then not
evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hanlm.evals.tasks.base import Options, Task, register
from hanlm.testsets.readers import WHERE_TO_GET

STOP = ("\n\n", "질문:", "<|endoftext|>")
_STRICT = re.compile(r"####\s*(-?[$₩€£]?\s*\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"-?[$₩€£]?\d[\d,]*(?:\.\d+)?")


def normalise(answer: str | None) -> str | None:
    if answer is None:
        return None
    text = answer.strip()
    for sign in ("$", "₩", "€", "£", ",", " "):
        text = text.replace(sign, "")
    return text.removesuffix(".") or None


def extract_strict(text: str) -> str | None:
    found = _STRICT.search(text)
    return normalise(found.group(1)) if found else None


def extract_flexible(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return normalise(numbers[-1]) if numbers else None


def _solution(fields: dict) -> str:
    answer = fields["answer"].strip()
    if "####" not in answer:
        answer += f"\n#### {fields['target']}"
    return answer


def prompt(question: str, shots: Sequence[dict] = ()) -> str:
    examples = "".join(f"질문: {s['question']}\n답변: {_solution(s)}\n\n" for s in shots)
    return f"{examples}질문: {question}\n답변:"


@register
class Gsm8kKo(Task):
    name = "gsm8k_ko"
    benchmark = "gsm8k_ko"
    where_to_get = WHERE_TO_GET["gsm8k_ko"]

    def __init__(self):
        self.shots: list[dict] = []

    def load(self, source, *, demo_files, options: Options) -> list:
        items = super().load(source, demo_files=demo_files, options=options)
        shots = options.num_fewshot
        self.shots = [item.fields for item in items[:shots]]
        return items[shots:]

    def evaluate(self, model, items: Sequence, options: Options) -> list[dict]:
        prompts = [prompt(item.fields["question"], self.shots) for item in items]
        if options.chat_template:
            prompts = [model.apply_chat_template(p) for p in prompts]
        outputs = model.generate(prompts, stop=STOP, max_new_tokens=options.max_new_tokens)
        samples = []
        for item, output in zip(items, outputs, strict=True):
            gold = normalise(str(item.fields["target"]))
            strict, flexible = extract_strict(output), extract_flexible(output)
            samples.append(
                {
                    "item_id": item.item_id,
                    "generation": output,
                    "prediction": {"strict": strict, "flexible": flexible},
                    "gold": gold,
                    "scores": {
                        "exact_match_strict": float(strict == gold),
                        "exact_match_flexible": float(flexible == gold),
                    },
                }
            )
        return samples
