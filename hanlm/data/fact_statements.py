"""Facts written both ways: a table of (subject, relation, object) becomes training documents that
state each fact subject first and object first.

The field report's model learned "A's capital is B" and not "B is the capital of which country":
a language model learns each direction from text that states it, and web text mostly states a
fact one way. The augmentation writes the other way too. A share of the facts (`reverse_share`,
a seeded pick) gets its reverse statements and the rest keeps forward ones only, so the direction
probe can compare the two groups in one model; `probe_table` writes the table with the column
`reverse_stated` it reads (hanlm.evals.tasks.direction).

Input: TSV with a header naming subject, relation, object (other columns ignored), or JSONL with
those keys. Sentences come from templates per relation, `{subject}` and `{object}` slots with
Korean particles as in the demo world (`{object:은/는}`); the built-in ones cover `capital`,
others come from a TOML file:

    [founder]
    forward = ["{subject:은/는} {object:이/가} 세웠다."]
    reverse = ["{object:은/는} {subject:을/를} 세운 사람이다."]

Output: JSONL documents, one per fact and copy (`{"id", "text"}`), for `corpus.inputs`.
"""

from __future__ import annotations

import csv
import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hanlm.demo.templating import fill, slots
from hanlm.errors import UserError
from hanlm.files import atomic_write_text

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

COLUMNS = ("subject", "relation", "object")
SLOT_NAMES = frozenset({"subject", "object"})

# Built-in templates: the demo world's capital statements, in both directions.
BUILTIN_TEMPLATES: dict[str, dict[str, list[str]]] = {
    "capital": {
        "forward": [
            "{subject}의 수도는 {object:이다/다}.",
            "{subject}의 수도는 {object}입니다.",
            "{subject}에서 수도 역할을 하는 도시는 {object:이다/다}.",
        ],
        "reverse": [
            "{object:은/는} {subject}의 수도이다.",
            "{object:을/를} 수도로 하는 나라는 {subject:이다/다}.",
            "{object:은/는} {subject}에서 수도 역할을 하는 도시입니다.",
        ],
    }
}


@dataclass(frozen=True)
class FactRow:
    subject: str
    relation: str
    object: str


def read_table(path: Path) -> list[FactRow]:
    """The facts of a TSV (header naming subject, relation, object) or JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"facts table {path} does not exist", fix="give a .tsv or .jsonl file")
    rows = _read_jsonl(path) if path.suffix == ".jsonl" else _read_tsv(path)
    if not rows:
        raise UserError(f"no facts in {path}", where=str(path), fix="add a fact per line")
    return rows


def _row(values: Mapping, where: str) -> FactRow:
    cleaned = {c: str(values.get(c) or "").strip() for c in COLUMNS}
    empty = [c for c in COLUMNS if not cleaned[c]]
    if empty:
        raise UserError(
            f"a fact without {', '.join(empty)}",
            where=where,
            fix="fill subject, relation and object, or delete the line",
        )
    return FactRow(**cleaned)


def read_tsv_table(path: Path, *, fix: str, prefix: str = "") -> tuple[list[str], list]:
    """A facts TSV's header and its (line number, row) pairs; a UserError (its message after
    `prefix`) when the header lacks subject, relation or object. Shared with the direction probe."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = list(reader.fieldnames or [])
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise UserError(
                f"{prefix}{path} has no column {', '.join(missing)}", where=str(path), fix=fix
            )
        return header, list(enumerate(reader, 2))


def _read_tsv(path: Path) -> list[FactRow]:
    _, rows = read_tsv_table(
        path,
        fix="the first line must name the tab-separated columns subject, relation, object "
        "(or give a .jsonl file with those keys)",
    )
    return [_row(row, f"{path}:{number}") for number, row in rows]


def _read_jsonl(path: Path) -> list[FactRow]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"not JSON: {e}", where=f"{path}:{number}") from None
            if not isinstance(record, dict):
                raise UserError(
                    "a line is not a JSON object", where=f"{path}:{number}",
                    fix='write {"subject": ..., "relation": ..., "object": ...} per line',
                )  # fmt: skip
            rows.append(_row(record, f"{path}:{number}"))
    return rows


def load_templates(path: Path | None) -> dict[str, dict[str, list[str]]]:
    """The built-in templates, updated by a TOML file's (a relation per table with `forward` and
    `reverse` lists); every template is checked to name only {subject} and {object}."""
    templates = {k: dict(v) for k, v in BUILTIN_TEMPLATES.items()}
    if path is not None:
        path = Path(path)
        try:
            parsed = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UserError(f"cannot read the templates: {e}", where=str(path)) from None
        for relation, table in parsed.items():
            if not isinstance(table, dict) or set(table) != {"forward", "reverse"}:
                raise UserError(
                    f"templates for {relation!r} must be a table with forward and reverse lists",
                    where=str(path),
                    fix=f'[{relation}]\nforward = ["..."]\nreverse = ["..."]',
                )
            templates[relation] = table
    for relation, table in templates.items():
        for direction in ("forward", "reverse"):
            _check_templates(relation, direction, table[direction], path)
    return templates


def _check_templates(relation: str, direction: str, texts, path: Path | None) -> None:
    where = str(path) if path else None
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise UserError(f"{relation}.{direction} must be a non-empty list of strings", where=where)
    for text in texts:
        names = {name for name, _ in slots(text)}
        if names - SLOT_NAMES or "subject" not in names or "object" not in names:
            raise UserError(
                f"template {text!r} ({relation}.{direction}) must name {{subject}} and {{object}} "
                "and no other slot",
                where=where,
            )


def pick_reverse_stated(facts: Sequence[FactRow], share: float, seed: int) -> set[FactRow]:
    """A seeded `share` of the facts (rounded to whole facts): those given reverse statements."""
    if not 0 <= share <= 1:
        raise UserError(f"reverse share {share} is not between 0 and 1", fix="use 0..1, e.g. 0.5")
    count = round(share * len(facts))
    return set(random.Random(f"hanlm-facts:{seed}").sample(list(facts), count))


def documents(
    facts: Sequence[FactRow],
    templates: Mapping[str, Mapping[str, list[str]]],
    reverse_stated: set[FactRow],
    *,
    copies: int = 1,
    seed: int = 0,
) -> list[dict]:
    """`copies` documents per fact, each a forward statement and, for the facts in
    `reverse_stated`, a reverse one, phrasings drawn (seeded) from the templates."""
    if copies < 1:
        raise UserError(f"copies must be at least 1, got {copies}")
    unknown = sorted({f.relation for f in facts} - set(templates))
    if unknown:
        raise UserError(
            f"no sentence templates for relation {', '.join(map(repr, unknown))}",
            fix="give a templates TOML with a [RELATION] table of forward and reverse lists "
            f"(built in: {', '.join(sorted(BUILTIN_TEMPLATES))})",
        )
    rng = random.Random(f"hanlm-facts:{seed}:text")
    out = []
    for number, fact in enumerate(facts):
        values = {"subject": fact.subject, "object": fact.object}
        for copy in range(copies):
            sentences = [fill(rng.choice(templates[fact.relation]["forward"]), **values)]
            if fact in reverse_stated:
                sentences.append(fill(rng.choice(templates[fact.relation]["reverse"]), **values))
                rng.shuffle(sentences)  # neither direction always first
            out.append({"id": f"fact-{number:06d}-{copy}", "text": " ".join(sentences)})
    return out


def probe_table(facts: Sequence[FactRow], reverse_stated: set[FactRow]) -> str:
    """The facts as the direction probe's TSV, with the reverse_stated column."""
    lines = ["subject\trelation\tobject\treverse_stated"]
    for f in facts:
        if any("\t" in v or "\n" in v for v in (f.subject, f.relation, f.object)):
            raise UserError(f"a fact holds a tab or line break: {f}", fix="remove it")
        lines.append(
            f"{f.subject}\t{f.relation}\t{f.object}\t{'yes' if f in reverse_stated else 'no'}"
        )
    return "\n".join(lines) + "\n"


def write(
    table: Path,
    out: Path,
    *,
    templates_file: Path | None = None,
    reverse_share: float = 1.0,
    copies: int = 1,
    seed: int = 0,
    probe_out: Path | None = None,
    replace: bool = False,
) -> dict:
    """Read `table`, write its statements as JSONL documents to `out` (and the probe's table to
    `probe_out`); every input is checked before anything is written, and an existing output
    file is replaced only with `replace`."""
    for path in (out, probe_out):
        if path is not None and os.path.lexists(path) and not replace:
            raise UserError(f"{path} already exists", fix="choose another path or pass --force")
        if path is not None and Path(path).is_dir():
            raise UserError(f"{path} is a folder", fix="give a file path")
    facts = read_table(table)
    templates = load_templates(templates_file)
    stated = pick_reverse_stated(facts, reverse_share, seed)
    docs = documents(facts, templates, stated, copies=copies, seed=seed)
    probe = probe_table(facts, stated) if probe_out is not None else None
    atomic_write_text(Path(out), "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    if probe is not None:
        atomic_write_text(Path(probe_out), probe)
    return {"facts": len(facts), "reverse_stated": len(stated), "documents": len(docs)}
