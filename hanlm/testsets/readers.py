"""Benchmark readers shared by decontamination and the eval stage.

Each reader turns one benchmark file into `Item`s with the same normalised `fields` whatever the
layout on disk: the public KoBEST TSV release (`SKT-LSL/KoBEST_datarepo`, v1.0) or the Hugging
Face `skt/kobest_v1` layout saved as .jsonl, .json, .parquet or .csv; GSM8K-ko JSONL; IFEval
JSONL; the demo world's two-choice benchmark; any JSONL with a named text field.

A KoBEST TSV file is read as skt/kobest_v1's loading script read it, `pandas.read_csv(sep="\t")`
then `dropna()`: CSV quoting applies (a field that starts with `"` is quoted, `""` inside it is
one `"`), and a row with a field equal to one of pandas' NA strings ("", "NA", "null", ...) is
dropped. So the TSV gives the very text the Hugging Face layout holds (docs/kobest.md).

`item_id`: for KoBEST, the 0-based position of the row among the rows skt/kobest_v1 keeps (the
`doc_id` lm-evaluation-harness gives it), in every layout; the TSV's 1-based ID column is not
used, so a decontamination report from one layout labels the same items as an eval on another.
Other benchmarks: the file's ID column when it has one, else the 0-based row index (header
excluded). `overlap_text` is what would appear in training text if the item leaked: its passage,
question and answer text (labels such as a COPA choice number are turned into the text they
stand for; bare yes/no labels of BoolQ, SentiNeg and WiC are not text and are left out). `parts`
are the same texts one distinguishing field each (COPA premise and right alternative, BoolQ
passage and question, ...): decontamination looks for each on its own, so an item written into a
document in another order or with a connective between its parts is still found. Both are
natural text: WiC's [target] brackets, which the scored prompt keeps, are not in them.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hanlm.console import warn
from hanlm.errors import UserError
from hanlm.streams import open_text_stream, strip_compression_suffix


@dataclass(frozen=True)
class Item:
    benchmark: str
    item_id: str
    fields: dict[str, Any]
    overlap_text: str
    parts: tuple[str, ...] = ()
    forms: tuple[str, ...] = ()  # other texts the item may leak as, each looked for whole


BENCHMARKS: tuple[str, ...] = (
    "kobest_boolq",
    "kobest_copa",
    "kobest_hellaswag",
    "kobest_sentineg",
    "kobest_wic",
    "gsm8k_ko",
    "ifeval_ko",
    "demo_qa",
    "jsonl",
)

_KOBEST_SOURCE = (
    "the KoBEST TSV release (github.com/SKT-LSL/KoBEST_datarepo, v1.0/) or the Hugging Face "
    "dataset skt/kobest_v1 saved with datasets' to_json/to_parquet"
)
WHERE_TO_GET = {
    "kobest_boolq": _KOBEST_SOURCE,
    "kobest_copa": _KOBEST_SOURCE,
    "kobest_hellaswag": _KOBEST_SOURCE,
    "kobest_sentineg": _KOBEST_SOURCE,
    "kobest_wic": _KOBEST_SOURCE,
    "gsm8k_ko": "a GSM8K Korean translation with question/answer or kor_question/kor_answer "
    "fields: the Hub's thunder-research-group/snu_gsm8k once its conditions are accepted on its "
    "page and `hf auth login` (gated), as hf:thunder-research-group/snu_gsm8k:test, or a JSONL "
    "file such as xfactlab/kt-ai-challenge's data/reasoning-data/kor-gsm8k/",
    "ifeval_ko": "the Hub's allganize/IFEval-Ko as hf:allganize/IFEval-Ko:train (offline: `hf "
    "download allganize/IFEval-Ko --repo-type dataset --local-dir DIR`, then hf:DIR:train), or "
    "an IFEval-format JSONL (key, prompt, instruction_id_list, kwargs)",
    "demo_qa": "the demo world: `hanlm demo --out DIR` writes DIR/benchmark.jsonl "
    "(a run's corpus stage writes RUN/demo/benchmark.jsonl)",
    "jsonl": "any JSONL file with one string field per line",
}


def parse_spec(spec: str) -> tuple[str, str]:
    """`TASK=PATH` -> (task, path); a UserError when malformed or the task is unknown."""
    task, sep, path = spec.partition("=")
    task, path = task.strip(), path.strip()
    if not sep or not task or not path:
        raise UserError(
            f"bad benchmark spec {spec!r}",
            fix=f"write it as TASK=PATH with TASK one of {', '.join(BENCHMARKS)}",
        )
    if task not in BENCHMARKS:
        raise UserError(
            f"unknown benchmark {task!r} in {spec!r}", fix=f"choose one of {', '.join(BENCHMARKS)}"
        )
    return task, path


# ---------------------------------------------------------------------------------------------
# Rows from any layout: (where, row) pairs with `where` = "FILE:LINE" for error messages


# pandas' default NA strings (pandas._libs.parsers.STR_NA_VALUES; "None" joined them in pandas
# 2.0). read_csv turns a field equal to one of them, quoted or not, into NaN, and skt/kobest_v1's
# loader then dropped every row with a NaN in any column, used or not.
PANDAS_NA_STRINGS = frozenset(
    {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
     "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}
)  # fmt: skip


def _tsv_records(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) of each record, tokenised as pandas' C parser does with
    sep="\t" and its defaults: a field that starts with `"` is quoted (tabs and line breaks
    inside it are text, `""` is one `"`, text after the closing quote is appended), a `"` anywhere
    else is a literal character, lines end at \n, \r\n or \r, a line that is empty or all
    spaces is skipped, and a quote still open at the end of the file is an error. Python's csv
    module tokenises by the same rules; the last two, which it lacks, are checked here."""
    input_done, last_text = False, ""

    def lines() -> Iterator[str]:
        nonlocal input_done, last_text
        for line in io.StringIO(text, newline=""):  # split at \n, \r\n and \r; ends kept
            last_text = line
            yield line
        input_done = True

    reader = csv.reader(lines(), delimiter="\t", quotechar='"', doublequote=True, strict=False)
    previous_limit = csv.field_size_limit(max(len(text), 131072))  # pandas has no field limit
    try:
        last_line = 0
        for values in reader:
            first_line = last_line + 1
            if input_done:  # csv asks for more input only inside a quoted field
                raise UserError(
                    "a quoted field opens on this line and never closes",
                    where=f"{path}:{first_line}",
                    fix='close the quote, or double a `"` that is part of the text ("")',
                )
            one_line = reader.line_num == first_line
            last_line = reader.line_num
            if one_line and not last_text.rstrip("\r\n").strip(" "):
                continue  # empty or spaces only (not `""`, a quoted field): pandas skips it
            yield first_line, values
    finally:
        csv.field_size_limit(previous_limit)


def _rows_tsv(path: Path, *, drop_na: bool) -> Iterator[tuple[str, dict]]:
    text = _decode(path)
    header: list[str] | None = None
    dropped: list[int] = []
    for line_no, values in _tsv_records(text, path):
        if header is None:
            header = [h.strip() for h in values]
            continue
        if len(values) != len(header):
            raise UserError(
                f"line has {len(values)} tab-separated columns, the header has {len(header)}",
                where=f"{path}:{line_no}",
                fix="check the file is the unmodified tab-separated release (a field with a tab "
                'or a line break in it must be quoted: "...")',
            )
        if drop_na and any(v in PANDAS_NA_STRINGS for v in values):
            dropped.append(line_no)
            continue
        yield f"{path}:{line_no}", dict(zip(header, values, strict=True))
    if dropped:
        lines = ", ".join(map(str, dropped[:5])) + (", ..." if len(dropped) > 5 else "")
        warn(
            f"{path}: left out {len(dropped)} row(s) with an empty or NA field (lines {lines}), "
            "as skt/kobest_v1 did (pandas dropna)"
        )


def _decode(path: Path) -> str:
    with open_text_stream(path) as stream:
        raw = stream.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(
            f"not UTF-8 text: {e}", where=str(path), fix="save the file as UTF-8"
        ) from None


def _rows_csv(path: Path) -> Iterator[tuple[str, dict]]:
    # newline="": a quoted field may hold line breaks (pandas' and datasets' to_csv quote them)
    reader = csv.reader(io.StringIO(_decode(path), newline=""))
    header: list[str] | None = None
    last_line = 0
    for values in reader:
        where = f"{path}:{last_line + 1}"
        last_line = reader.line_num
        if not values:
            continue
        if header is None:
            header = values
            continue
        if len(values) != len(header):
            raise UserError(
                f"line has {len(values)} comma-separated columns, the header has {len(header)}",
                where=where,
                fix="check the file is a complete CSV with one header line",
            )
        yield where, dict(zip(header, values, strict=True))


_JSONL_FIX = (
    "give a JSON Lines file: one JSON object per line, UTF-8 (a .jsonl saved with datasets' "
    "to_json, or the benchmark's own release)"
)


def _rows_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    with open_text_stream(path) as stream:
        for line_no, raw in enumerate(stream, start=1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                row = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise UserError(f"not a JSON line: {e}", where=where, fix=_JSONL_FIX) from None
            if not isinstance(row, dict):
                raise UserError("a JSON line is not an object", where=where, fix=_JSONL_FIX)
            yield where, row


def _rows_json(path: Path) -> Iterator[tuple[str, dict]]:
    with open_text_stream(path) as stream:
        raw = stream.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        yield from _rows_jsonl(path)  # datasets' to_json writes JSON lines under a .json name
        return
    if isinstance(data, dict):  # {"data": [...]} or a column dict {"col": [...]}
        lists = [v for v in data.values() if isinstance(v, list)]
        if "data" in data and isinstance(data["data"], list):
            data = data["data"]
        elif lists and all(isinstance(v, list) and len(v) == len(lists[0]) for v in data.values()):
            data = [
                dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)
            ]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise UserError(
            "JSON file is not a list of records",
            where=str(path),
            fix="give a JSON list of objects, a {column: [values]} object, or JSON Lines",
        )
    for i, row in enumerate(data):
        yield f"{path}:record {i}", row


def _rows_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq  # deferred: heavy; only parquet benchmark files need it

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise UserError(f"cannot read parquet file: {e}", where=str(path)) from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path}:row {i + 1}", row


def _rows(path: Path, task: str) -> Iterator[tuple[str, dict]]:
    if not path.is_file():
        raise UserError(
            f"benchmark file for {task} not found: {path}",
            where=str(path),
            fix=f"get it from {WHERE_TO_GET[task]}",
        )
    kind = Path(strip_compression_suffix(path.name)).suffix.lower()
    readers: dict[str, Callable[[Path], Iterator[tuple[str, dict]]]] = {
        # KoBEST TSVs lose their NA rows as the Hugging Face layout did
        ".tsv": lambda p: _rows_tsv(p, drop_na=task.startswith("kobest_")),
        ".csv": _rows_csv,
        ".jsonl": _rows_jsonl,
        ".json": _rows_json,
        ".parquet": _rows_parquet,
    }
    if kind not in readers:
        raise UserError(
            f"unsupported benchmark file type {path.name!r}",
            where=str(path),
            fix="use .tsv, .csv, .jsonl, .json or .parquet (optionally .gz/.zst)",
        )
    yield from readers[kind](path)


# ---------------------------------------------------------------------------------------------
# Field access with errors that name the file, line and column


class _Row:
    def __init__(self, task: str, where: str, row: dict):
        self.task, self.where, self.row = task, where, row
        # Column names compared case- and space-insensitively: "Dictionary 1", "label", "Label".
        self._keys = {re.sub(r"\s+", "", str(k)).lower(): k for k in row}

    def has(self, name: str) -> bool:
        return re.sub(r"\s+", "", name).lower() in self._keys

    def get(self, *names: str) -> Any:
        for name in names:
            key = self._keys.get(re.sub(r"\s+", "", name).lower())
            if key is not None:
                return self.row[key]
        raise UserError(
            f"{self.task}: missing column {' or '.join(repr(n) for n in names)} "
            f"(columns: {', '.join(map(str, self.row))})",
            where=self.where,
            fix=f"use the layout of {WHERE_TO_GET[self.task]}",
        )

    def text(self, *names: str) -> str:
        value = self.get(*names)
        if not isinstance(value, str):
            self.bad(names[0], value, "text")
        return value

    def bad(self, name: str, value: Any, expected: str):
        raise UserError(
            f"{self.task}: column {name!r} has {value!r}, expected {expected}",
            where=self.where,
            fix=f"check the file against the layout of {WHERE_TO_GET[self.task]}",
        )

    def integer(self, name: str, *aliases: str, allowed: range) -> int:
        value = self.get(name, *aliases)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
            self.bad(name, value, f"an integer in {allowed.start}..{allowed.stop - 1}")
        return value

    def boolean(self, *names: str) -> bool:
        value = self.get(*names)
        text = str(value).strip().lower()
        if isinstance(value, bool):
            return value
        if text in ("true", "1", "참", "예", "yes"):
            return True
        if text in ("false", "0", "거짓", "아니요", "no"):
            return False
        return self.bad(names[0], value, "True/False or 1/0")

    def item_id(self, index: int) -> str:
        for name in ("id", "ID", "key", "item_id"):
            if self.has(name):
                value = self.get(name)
                if value is not None and str(value).strip():
                    return str(value).strip()
        return str(index)


def _join(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# One function per benchmark: row -> (fields, parts)


def _boolq(row: _Row) -> tuple[dict, str]:
    paragraph, question = row.text("paragraph", "Text"), row.text("question")
    fields = {
        "paragraph": paragraph,
        "question": question,
        "label": int(row.boolean("label", "Answer")),
    }
    return fields, (paragraph, question)


def _copa(row: _Row) -> tuple[dict, str]:
    premise, question = row.text("premise", "sentence"), row.text("question").strip()
    if question not in ("원인", "결과"):
        row.bad("question", question, "원인 or 결과")
    alternatives = [row.text("alternative_1", "1"), row.text("alternative_2", "2")]
    if row.has("label"):
        label = row.integer("label", allowed=range(2))
    else:
        label = row.integer("Answer", allowed=range(1, 3)) - 1  # the TSV numbers choices 1 and 2
    fields = {
        "premise": premise,
        "question": question,
        "alternative_1": alternatives[0],
        "alternative_2": alternatives[1],
        "label": label,
    }
    return fields, (premise, alternatives[label])


def _hellaswag(row: _Row) -> tuple[dict, str]:
    context = row.text("context")
    endings = [row.text(f"ending_{i}", f"choice{i}") for i in range(1, 5)]
    label = row.integer("label", allowed=range(4))
    return {"context": context, "endings": endings, "label": label}, (context, endings[label])


def _sentineg(row: _Row) -> tuple[dict, str]:
    sentence = row.text("sentence", "Text")
    return {"sentence": sentence, "label": row.integer("label", allowed=range(2))}, (sentence,)


_BRACKETED = re.compile(r"\[([^\[\]]*)\]")


def _wic(row: _Row) -> tuple[dict, str]:
    # Both layouts mark the target word as [word]; lm-evaluation-harness scores the sentences
    # with the brackets, so the fields keep them. Training text would not have them.
    word = row.text("word", "Target")
    first, second = row.text("context_1", "SENTENCE1"), row.text("context_2", "SENTENCE2")
    fields = {
        "word": word,
        "context_1": first,
        "context_2": second,
        "label": int(row.boolean("label", "ANSWER")),
    }
    return fields, (_BRACKETED.sub(r"\1", first), _BRACKETED.sub(r"\1", second))


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _gsm8k(row: _Row) -> tuple[dict, str]:
    korean = row.has("kor_question") and row.has("kor_answer")
    question = row.text("kor_question") if korean else row.text("question")
    answer = row.text("kor_answer") if korean else row.text("answer")
    target = None
    if row.has("answer_s") and row.get("answer_s") not in (None, ""):
        target = str(row.get("answer_s")).strip()
    else:
        for text in (answer, row.get("answer") if row.has("answer") else ""):
            if isinstance(text, str) and "####" in text:
                target = text.rsplit("####", 1)[1].strip()
                break
        if target is None:
            numbers = _NUMBER.findall(answer)
            if not numbers:
                row.bad("answer", answer, "a solution with a final number (or an answer_s field)")
            target = numbers[-1]
    target = target.replace(",", "")
    return {"question": question, "answer": answer, "target": target}, (question, answer)


def _ifeval(row: _Row) -> tuple[dict, str]:
    prompt = row.text("prompt")
    ids = row.get("instruction_id_list")
    kwargs = row.get("kwargs")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        row.bad("instruction_id_list", ids, "a list of instruction ids")
    if not isinstance(kwargs, list):
        row.bad("kwargs", kwargs, "a list of argument objects")
    fields = {"key": row.get("key"), "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}
    return fields, (prompt,)


def _demo_qa(row: _Row) -> tuple[dict, str]:
    choices = row.get("choices")
    if not (
        isinstance(choices, list)
        and len(choices) >= 2
        and all(isinstance(c, str) and c.strip() for c in choices)
    ):
        row.bad("choices", choices, "a list of two or more answer texts")
    fields = {
        "passage": row.text("passage"),
        "question": row.text("question"),
        "choices": list(choices),
        "answer": row.integer("answer", allowed=range(len(choices))),
    }
    # The answers are sentences every item about the country shares (the encyclopedia's words):
    # they distinguish nothing alone, but are in the overlap text, as the corpus would copy them.
    return fields, (fields["passage"], fields["question"])


def item_text(item: dict) -> str:
    """A demo benchmark item as it would appear in training text: the passage, the question and
    the right answer, a line each; planted verbatim copies are this."""
    return f"{item['passage']}\n{item['question']}\n{item['choices'][int(item['answer'])]}"


def _overlap_text(benchmark: str, fields: dict, parts: tuple[str, ...]) -> str:
    if benchmark == "demo_qa":
        return item_text(fields)  # what the demo world plants: passage, question and answer
    return _join(*parts)


_READERS: dict[str, Callable[[_Row], tuple[dict, tuple[str, ...]]]] = {
    "kobest_boolq": _boolq,
    "kobest_copa": _copa,
    "kobest_hellaswag": _hellaswag,
    "kobest_sentineg": _sentineg,
    "kobest_wic": _wic,
    "gsm8k_ko": _gsm8k,
    "ifeval_ko": _ifeval,
    "demo_qa": _demo_qa,
}


def read(benchmark: str, path: str | Path, *, text_field: str = "text") -> list[Item]:
    """Every item of one benchmark file, in file order."""
    if benchmark not in BENCHMARKS:
        raise UserError(
            f"unknown benchmark {benchmark!r}", fix=f"choose one of {', '.join(BENCHMARKS)}"
        )
    path = Path(path).expanduser()
    items: list[Item] = []
    seen: set[str] = set()
    for index, (where, raw) in enumerate(_rows(path, benchmark)):
        row = _Row(benchmark, where, raw)
        if benchmark == "jsonl":
            fields = {"text": row.text(text_field)}
            parts: tuple[str, ...] = (fields["text"],)
        else:
            fields, parts = _READERS[benchmark](row)
        overlap = _overlap_text(benchmark, fields, parts)
        # KoBEST: the row's position (lm-evaluation-harness's doc_id), the same in every layout
        item_id = str(index) if benchmark.startswith("kobest_") else row.item_id(index)
        if item_id in seen:
            raise UserError(
                f"{benchmark}: item id {item_id!r} appears twice",
                where=where,
                fix="give every row a distinct ID (or drop the ID column to number rows)",
            )
        seen.add(item_id)
        items.append(Item(benchmark, item_id, fields, overlap, tuple(p for p in parts if p)))
    if not items:
        raise UserError(
            f"{benchmark}: no items in {path}",
            where=str(path),
            fix=f"get the data from {WHERE_TO_GET[benchmark]}",
        )
    return items
