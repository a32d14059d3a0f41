"""KoBEST (BoolQ, COPA, HellaSwag, SentiNeg, WiC) as lm-evaluation-harness's `kobest_*` tasks
score them: the same prompts, choices (after a space), `acc`, `acc_norm` (HellaSwag: log-likelihood
divided by the choice's length in characters) and macro F1 over (gold, argmax) pairs.

The fields come from hanlm.testsets.readers, which gives the text of skt/kobest_v1 from either the
TSV release or the Hugging Face layout, and the row's position there as the item id (lm-eval's
doc_id). docs/kobest.md writes out, per task, the exact text scored; tests/integration/test_harness.py checks
it against lm-evaluation-harness request by request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from hanlm.evals.tasks import Options, Task, macro_f1, register

KOBEST_HF = "hf:skt/kobest_v1:{config}:validation"
NO_YES = ("아니오", "예")
WHERE = (
    "the KoBEST TSV release (github.com/SKT-LSL/KoBEST_datarepo, v1.0/{folder}/dev.tsv) or "
    "the Hugging Face dataset skt/kobest_v1 ({config}); online, --task {name} alone reads it"
)


class MultipleChoiceTask(Task):
    """Score every choice as a continuation of the context; predict the most likely."""

    target_delimiter: ClassVar[str] = " "
    has_acc_norm: ClassVar[bool] = False
    has_f1: ClassVar[bool] = True
    # the answer words when every item has the same ones (yes/no tasks); else choices() says
    labels: ClassVar[tuple[str, ...]] = ()

    def context(self, fields: dict) -> str:
        raise NotImplementedError

    def choices(self, fields: dict) -> list[str]:
        if not self.labels:
            raise NotImplementedError
        return list(self.labels)

    def gold(self, fields: dict) -> int:
        return int(fields["label"])

    def evaluate(self, model, items: Sequence, options: Options) -> list[dict]:
        pairs, spans = [], []
        for item in items:
            context, choices = self.context(item.fields), self.choices(item.fields)
            spans.append((len(pairs), len(choices)))
            pairs += [(context, self.target_delimiter + c) for c in choices]
        results = model.loglikelihood(pairs)
        samples = []
        for item, (start, count) in zip(items, spans, strict=True):
            lls = [results[start + i][0] for i in range(count)]
            choices, gold = self.choices(item.fields), self.gold(item.fields)
            prediction = _argmax(lls)
            scores = {"acc": float(prediction == gold)}
            if self.has_acc_norm:
                normed = [ll / len(c) for ll, c in zip(lls, choices, strict=True)]
                scores["acc_norm"] = float(_argmax(normed) == gold)
            samples.append(
                {
                    "item_id": item.item_id,
                    "loglikelihoods": lls,
                    "prediction": prediction,
                    "gold": gold,
                    "scores": scores,
                }
            )
        return samples

    def aggregate(self, samples: Sequence[dict]) -> dict[str, dict]:
        metrics = super().aggregate(samples)
        if self.has_f1:
            golds = [s["gold"] for s in samples]
            preds = [s["prediction"] for s in samples]
            value = macro_f1(golds, preds) if samples else None
            metrics["macro_f1"] = {"value": value, "stderr": None, "n": len(samples)}
        return metrics


def _argmax(values: Sequence[float]) -> int:
    # the first of equal maxima, as numpy.argmax
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


class KobestTask(MultipleChoiceTask):
    config: ClassVar[str]
    folder: ClassVar[str]

    def __init_subclass__(cls, *, config: str, folder: str, **kwargs):
        """`config`: skt/kobest_v1's configuration, `folder`: the TSV release's; the task is
        lm-eval's `kobest_<config>`."""
        super().__init_subclass__(**kwargs)
        cls.name = cls.benchmark = f"kobest_{config}"
        cls.config, cls.folder = config, folder
        cls.where_to_get = WHERE.format(folder=folder, config=config, name=cls.name)

    def default_source(self, demo_files) -> str:
        return KOBEST_HF.format(config=self.config)


@register
class BoolQ(KobestTask, config="boolq", folder="BoolQ"):
    labels = NO_YES

    def context(self, fields: dict) -> str:
        # the trailing space is lm-eval's
        return f"{fields['paragraph']} 질문: {fields['question']} 답변: "


@register
class Copa(KobestTask, config="copa", folder="COPA"):
    # lm-eval's connectors start with a space and are joined after one: "premise  왜냐하면"
    _CONNECTOR: ClassVar[dict[str, str]] = {"원인": " 왜냐하면", "결과": " 그래서"}

    def context(self, fields: dict) -> str:
        return f"{fields['premise']} {self._CONNECTOR[fields['question'].strip()]}"

    def choices(self, fields: dict) -> list[str]:
        return [fields["alternative_1"], fields["alternative_2"]]

    def gold(self, fields: dict) -> int:
        # lm-evaluation-harness's target is the right sentence's text, found among the choices
        right = fields["alternative_1"] if int(fields["label"]) == 0 else fields["alternative_2"]
        return self.choices(fields).index(right)


@register
class HellaSwag(KobestTask, config="hellaswag", folder="HellaSwag"):
    has_acc_norm = True

    def context(self, fields: dict) -> str:
        return f"문장: {fields['context']}"

    def choices(self, fields: dict) -> list[str]:
        return list(fields["endings"])


@register
class SentiNeg(KobestTask, config="sentineg", folder="SentiNeg"):
    labels = ("부정", "긍정")

    def context(self, fields: dict) -> str:
        return f"문장: {fields['sentence']} 긍부정:"


@register
class WiC(KobestTask, config="wic", folder="WiC"):
    labels = NO_YES

    def context(self, fields: dict) -> str:
        return (
            f"문장1: {fields['context_1']} 문장2: {fields['context_2']} "
            f"두 문장에서 {fields['word']}가 같은 뜻으로 쓰였나?"
        )
