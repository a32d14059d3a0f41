"""The demo world's two-choice benchmark: the passage and question as the demo corpus would copy
them (hanlm.testsets.readers.item_text), then each answer sentence on the next line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hanlm.evals.tasks.base import register
from hanlm.evals.tasks.kobest import MultipleChoiceTask


@register
class DemoQA(MultipleChoiceTask):
    name = "demo_qa"
    benchmark = "demo_qa"
    where_to_get = (
        "the demo world: a run's corpus stage writes RUN/demo/benchmark.jsonl, "
        "`hanlm demo --out DIR` writes DIR/benchmark.jsonl"
    )
    target_delimiter = "\n"
    # The right answer is first in half of the items: an F1 over positions says nothing.
    has_f1 = False

    def default_source(self, demo_files: Mapping[str, Path] | None) -> str | None:
        return None if demo_files is None else str(demo_files["benchmark"])

    def context(self, fields: dict) -> str:
        return f"{fields['passage']}\n{fields['question']}"

    def choices(self, fields: dict) -> list[str]:
        return list(fields["choices"])

    def gold(self, fields: dict) -> int:
        return int(fields["answer"])

    def evaluate(self, model, items, options) -> list[dict]:
        # The log-likelihood margin of the right answer over the best wrong one shows how sure
        # the model is, beyond the accuracy: what it learned, and what it memorised from the
        # planted (dirty) items.
        samples = super().evaluate(model, items, options)
        for s in samples:
            lls, gold = s["loglikelihoods"], s["gold"]
            others = [ll for i, ll in enumerate(lls) if i != gold]
            s["scores"]["gold_margin"] = lls[gold] - max(others)
        return samples
