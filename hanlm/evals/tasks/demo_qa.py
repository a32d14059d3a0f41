"""The demo world's yes/no benchmark: the passage and question as the demo corpus writes them
(hanlm.testsets.readers.item_text), then 예 or 아니요 on the next line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hanlm.evals.tasks import register
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
    labels = ("아니요", "예")

    def default_source(self, demo_files: Mapping[str, Path] | None) -> str | None:
        return None if demo_files is None else str(demo_files["benchmark"])

    def context(self, f: dict) -> str:
        return f"{f['passage']}\n{f['question']}"

    def gold(self, f: dict) -> int:
        return int(bool(f["answer"]))

    def evaluate(self, model, items, options) -> list[dict]:
        # A small model often answers every item alike (accuracy at chance); the log-likelihood
        # margin of the right answer still shows what it learned, and what it memorised from
        # planted (dirty) items.
        samples = super().evaluate(model, items, options)
        for s in samples:
            lls, gold = s["loglikelihoods"], s["gold"]
            others = [ll for i, ll in enumerate(lls) if i != gold]
            s["scores"]["gold_margin"] = lls[gold] - max(others)
        return samples
