"""The direction probe: is a fact known both ways?

For each fact (subject, relation, object) the forward prompt asks for the object ("A의 수도는"
-> " B") and the reverse prompt for the subject ("B를 수도로 하는 나라는" -> " A", with 을/를
chosen by B's last sound). Scores per direction: the log-probability of the right answer (summed
over its tokens), and whether it outranks `distractors` wrong answers of the same relation;
`gap` is forward minus reverse log-probability. Facts: a run's demo world (RUN/demo/facts.tsv)
or a user TSV with a header naming subject, relation and object.

An optional column `reverse_stated` (yes/no) says whether the training text also stated the fact
object first (the demo's `demo.reverse_share`, or `hanlm.data.fact_statements` for a user's
table). Then every score is also reported per group (`gap/reverse_stated`,
`gap/reverse_unstated`, ...): the facts the model could have learned backwards beside those it
could not, in the same model.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hanlm.data.fact_statements import COLUMNS, read_tsv_table
from hanlm.errors import UserError
from hanlm.evals.tasks.base import Options, Task, register
from hanlm.korean import josa

REVERSE_COLUMN = "reverse_stated"
_YES_NO = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
GROUPS = {True: "reverse_stated", False: "reverse_unstated"}
# relation -> (name in prompts, what the subject is)
RELATIONS = {"capital": ("수도", "나라")}


@dataclass(frozen=True)
class Fact:
    item_id: str
    fields: dict
    reverse_stated: bool | None = None  # None: the table does not say


def forward_prompt(subject: str, relation: str) -> str:
    name = RELATIONS.get(relation, (relation, "것"))[0]
    return f"{subject}의 {josa(name, '은/는')}"


def reverse_prompt(obj: str, relation: str) -> str:
    name, kind = RELATIONS.get(relation, (relation, "것"))
    return f"{josa(obj, '을/를')} {josa(name, '으로/로')} 하는 {josa(kind, '은/는')}"


def read_facts(path: Path) -> list[Fact]:
    if not path.is_file():
        raise UserError(
            f"direction: facts file {path} does not exist",
            fix="give --task direction=FACTS.tsv (columns subject, relation, object) or run the "
            "corpus stage on the demo world (it writes RUN/demo/facts.tsv)",
        )
    header, rows = read_tsv_table(
        path,
        prefix="direction: ",
        fix="the first line must name the tab-separated columns subject, relation, object",
    )
    grouped = REVERSE_COLUMN in header
    facts = []
    for number, row in rows:
        values = {c: (row.get(c) or "").strip() for c in COLUMNS}
        if not all(values.values()):
            raise UserError(
                "direction: a fact with an empty subject, relation or object",
                where=f"{path}:{number}",
                fix="fill every column or delete the line",
            )
        stated = _reverse_stated(row, path, number) if grouped else None
        facts.append(Fact(f"{values['subject']}|{values['relation']}", values, stated))
    if not facts:
        raise UserError(f"direction: no facts in {path}", where=str(path))
    return facts


def _reverse_stated(row: dict, path: Path, number: int) -> bool:
    value = (row.get(REVERSE_COLUMN) or "").strip().lower()
    if value not in _YES_NO:
        raise UserError(
            f"direction: {REVERSE_COLUMN} is {value!r}, not yes or no",
            where=f"{path}:{number}",
            fix=f"write yes or no in the {REVERSE_COLUMN} column, or drop the column",
        )
    return _YES_NO[value]


@register
class Direction(Task):
    name = "direction"
    benchmark = None  # facts, not benchmark items: decontamination does not list them
    where_to_get = "a TSV of subject, relation, object (the demo world writes RUN/demo/facts.tsv)"

    def default_source(self, demo_files: Mapping[str, Path] | None) -> str | None:
        return None if demo_files is None else str(demo_files["facts"])

    def load(self, source, *, demo_files, options: Options) -> list:
        source = source or self.default_source(demo_files)
        if source is None:
            raise UserError(
                "task direction needs a facts table",
                fix=f"write --task direction=PATH; {self.where_to_get}",
            )
        return read_facts(Path(source))

    def evaluate(self, model, items: Sequence[Fact], options: Options) -> list[dict]:
        rng = random.Random(options.seed)
        by_relation: dict[str, list[Fact]] = {}
        for fact in items:
            by_relation.setdefault(fact.fields["relation"], []).append(fact)
        pairs, plans = [], []
        for fact in items:
            f = fact.fields
            peers = [p.fields for p in by_relation[f["relation"]] if p.fields != f]
            wrong_objects = sorted({p["object"] for p in peers} - {f["object"]})
            wrong_subjects = sorted({p["subject"] for p in peers} - {f["subject"]})
            distractors = options.distractors
            forward = [
                f["object"],
                *rng.sample(wrong_objects, min(distractors, len(wrong_objects))),
            ]
            reverse = [
                f["subject"],
                *rng.sample(wrong_subjects, min(distractors, len(wrong_subjects))),
            ]
            start = len(pairs)
            pairs += [(forward_prompt(f["subject"], f["relation"]), " " + c) for c in forward]
            pairs += [(reverse_prompt(f["object"], f["relation"]), " " + c) for c in reverse]
            plans.append((start, len(forward), len(reverse), forward, reverse))
        results = model.loglikelihood(pairs)
        samples = []
        for fact, (start, nf, nr, forward, reverse) in zip(items, plans, strict=True):
            lf = [results[start + i][0] for i in range(nf)]
            lr = [results[start + nf + i][0] for i in range(nr)]
            scores = {
                "forward_logprob": lf[0],
                "reverse_logprob": lr[0],
                "gap": lf[0] - lr[0],
                "forward_acc": float(all(lf[0] > x for x in lf[1:])),
                "reverse_acc": float(all(lr[0] > x for x in lr[1:])),
            }
            samples.append(
                {
                    "item_id": fact.item_id,
                    "reverse_stated": fact.reverse_stated,
                    "choices": {"forward": forward, "reverse": reverse},
                    "loglikelihoods": {"forward": lf, "reverse": lr},
                    "prediction": {
                        "forward": forward[max(range(nf), key=lf.__getitem__)],
                        "reverse": reverse[max(range(nr), key=lr.__getitem__)],
                    },
                    "gold": {"forward": forward[0], "reverse": reverse[0]},
                    "scores": scores,
                }
            )
        return samples

    def aggregate(self, samples: Sequence[dict]) -> dict[str, dict]:
        """The mean scores over all facts and, when the table says which facts were also stated
        object first, over each group."""
        out = super().aggregate(samples)
        for stated, group in GROUPS.items():
            members = [s for s in samples if s.get("reverse_stated") is stated]
            if members:
                out.update({f"{k}/{group}": v for k, v in super().aggregate(members).items()})
        return out
