"""Chat data as sources: files or `hf:` ids in the shapes public instruction sets come in, read
into hanlm's conversations (`{"id", "messages": [{"role", "content"}]}`) and mixed by weight.

Formats (`[[sft.sources]] format`, or told from the first row that has one of their keys):
  messages  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
  sharegpt  {"conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}, ...],
             "system"?: str}; `from` is read as a role by SHAREGPT_ROLES
  alpaca    {"instruction": str, "input"?: str, "output": str, "system"?: str}: one user turn
            (the instruction, then a blank line and the input when there is one) and one
            assistant turn
`fields` renames a format's keys where a source spells them otherwise. Multi-turn
conversations and system prompts are kept. A row that cannot be read (not JSON, a shape that
is not the format's, an unknown role, no assistant turn, text holding the chat template's own
tokens) is skipped and counted by reason with a few examples (`sft.strict`: an error instead).

Mixing: with weights, the mix holds as many conversations as all sources together; each source
gives its weight's share of them, a seeded sample when it holds more, whole repeats and a seeded
sample of one more pass when it holds fewer (up to its max_epochs: past that an error before
training). A repeat's id carries `#repeat2`, ...: the closure check holds out whole
conversations, never a copy of one it trains on.
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hanlm.config import CHAT_FORMATS, SftSourceSection
from hanlm.console import info, warn
from hanlm.data import dataset_repo
from hanlm.data.chat_data import ROLES, TEMPLATE_MARKERS
from hanlm.errors import UserError
from hanlm.streams import open_text_stream, strip_compression_suffix

FORMAT_KEYS = {
    "messages": {"messages": "messages", "role": "role", "content": "content"},
    "sharegpt": {k: k for k in ("conversations", "from", "value", "system")},
    "alpaca": {k: k for k in ("instruction", "input", "output", "system")},
}
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user", "user": "user", "prompter": "user",
    "gpt": "assistant", "assistant": "assistant", "model": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant",
}  # fmt: skip
EXAMPLES = 3  # rows shown per reason in the report
REPEAT = "#repeat"  # a repeated conversation's id: ID#repeat2, ID#repeat3, ...
FILE_KINDS = (".jsonl", ".json", ".parquet")


class BadRow(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass
class SourceReport:
    """What was read of one source: its format (and whether it was told from its rows), the
    rows read, the conversations kept, the rows skipped by reason with examples."""

    name: str
    inputs: list[str]
    format: str
    detected: bool
    rows: int = 0
    conversations: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    # filled by mix(): conversations it gives the mix, and the passes that takes
    taken: int | None = None
    epochs: float | None = None

    def skip(self, problem: BadRow, where: str, strict: bool) -> None:
        if strict:
            raise UserError(
                f"sft source {self.name!r}: {problem.detail}",
                where=where,
                fix="repair or remove the row, or set sft.strict = false to skip and count it",
            )
        self.skipped[problem.reason] += 1
        shown = self.examples.setdefault(problem.reason, [])
        if len(shown) < EXAMPLES:
            shown.append(f"{where}: {problem.detail}")

    def as_dict(self) -> dict:
        return {
            "inputs": self.inputs, "format": self.format, "format_detected": self.detected,
            "rows": self.rows, "conversations": self.conversations,
            "skipped": dict(self.skipped), "skipped_examples": self.examples,
            "taken": self.taken, "epochs": self.epochs,
        }  # fmt: skip


# --- rows ------------------------------------------------------------------------------------


def _files(spec: str) -> list[Path]:
    matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(spec), recursive=True))
    files = [m for m in matches if m.is_file()]
    if not files:
        raise UserError(f"chat data {spec!r} matches no file", fix="check the path or glob")
    for path in files:
        kind = Path(strip_compression_suffix(path.name)).suffix.lower()
        if kind not in FILE_KINDS:
            raise UserError(
                f"unsupported chat data file {path.name!r}",
                where=str(path),
                fix=f"give {', '.join(FILE_KINDS)} files (optionally .gz or .zst) or an hf: id",
            )
    return files


def input_files(spec: str) -> list[Path] | None:
    """The files an input names (a glob, or a local snapshot's split), None for a Hub id."""
    if dataset_repo.is_hf_id(spec):
        folder = dataset_repo.snapshot_folder(spec)
        return dataset_repo.snapshot_files(spec) if folder is not None else None
    return _files(spec)


def rows(spec: str) -> Iterator[tuple[str, str, Any]]:
    """(where, the row's place as an id, row or BadRow) of each row of one input."""
    files = input_files(spec)
    if files is None:  # a Hub dataset, loaded whole by `datasets`
        for number, row in enumerate(dataset_repo.split_rows(spec), start=1):
            yield f"{spec}:row {number}", f"row-{number}", row
        return
    for path in files:
        yield from _file_rows(path)


def _file_rows(path: Path) -> Iterator[tuple[str, str, Any]]:
    kind = Path(strip_compression_suffix(path.name)).suffix.lower()
    if kind == ".parquet":
        import pyarrow.parquet as pq  # deferred: heavy

        number = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield f"{path}:row {number}", f"row-{number}", row
        return
    if kind == ".json":  # one JSON array of rows (how Alpaca-style sets are often shipped)
        with open_text_stream(path) as stream:
            try:
                data = json.loads(stream.read())
            except (ValueError, UnicodeDecodeError) as e:
                raise UserError(f"{path} is not a JSON document ({e})", where=str(path)) from None
        if not isinstance(data, list):
            raise UserError(f"{path} is not a JSON array of rows", where=str(path),
                            fix="give an array of objects, or JSON Lines (.jsonl)")  # fmt: skip
        for number, row in enumerate(data, start=1):
            yield f"{path}:row {number}", f"row-{number}", row
        return
    with open_text_stream(path) as stream:
        for number, raw in enumerate(stream, start=1):
            where, place = f"{path}:{number}", f"line-{number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield where, place, BadRow("invalid_utf8", "the line is not UTF-8 text")
                continue
            if not text.strip():
                continue
            try:
                yield where, place, json.loads(text)
            except json.JSONDecodeError as e:
                yield where, place, BadRow("corrupt_json", f"not valid JSON ({e.msg})")


# --- formats ---------------------------------------------------------------------------------


def detect(row: Any) -> str | None:
    """The format whose keys a row has (under their own names), or None."""
    if isinstance(row, list):
        return "messages"  # a bare list of messages
    if not isinstance(row, dict):
        return None
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row and "output" in row:
        return "alpaca"
    return None


def to_messages(row: Any, fmt: str, keys: dict[str, str]) -> list[dict]:
    """The messages of a row in format `fmt` (keys renamed by `keys`); BadRow when it has not
    the shape."""
    if fmt == "messages" and isinstance(row, list):
        row = {keys["messages"]: row}
    if not isinstance(row, dict):
        raise BadRow("not_an_object", "the row is not a JSON object")
    if fmt == "alpaca":
        instruction, extra, output = (row.get(keys[k]) for k in ("instruction", "input", "output"))
        if not isinstance(instruction, str) or not instruction.strip():
            raise BadRow("missing_field", f"no text in {keys['instruction']!r}")
        if not isinstance(output, str) or not output.strip():
            raise BadRow("no_assistant_turn", f"no text in {keys['output']!r}")
        user = instruction if not isinstance(extra, str) or not extra.strip() else (
            f"{instruction}\n\n{extra}"
        )  # fmt: skip
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
        return _with_system(row, keys, messages)
    turns_key = keys["messages" if fmt == "messages" else "conversations"]
    turns = row.get(turns_key)
    if not isinstance(turns, list) or not turns:
        raise BadRow("missing_field", f"no list of turns in {turns_key!r}")
    role_key, text_key = (keys["role"], keys["content"]) if fmt == "messages" else (
        keys["from"], keys["value"])  # fmt: skip
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadRow("bad_turn", f"turn {i} is not an object")
        said, text = turn.get(role_key), turn.get(text_key)
        role = said if fmt == "messages" else SHAREGPT_ROLES.get(str(said).lower())
        if role not in ROLES:
            raise BadRow("unknown_role", f"turn {i} has unknown role {said!r}")
        if not isinstance(text, str):
            raise BadRow("bad_turn", f"turn {i} has no text in {text_key!r}")
        messages.append({"role": role, "content": text})
    if fmt == "sharegpt":
        messages = _with_system(row, keys, messages)
    return messages


def _with_system(row: dict, keys: dict[str, str], messages: list[dict]) -> list[dict]:
    system = row.get(keys.get("system", "system"))
    if isinstance(system, str) and system.strip() and messages[0]["role"] != "system":
        return [{"role": "system", "content": system}, *messages]
    return messages


def _checked(messages: list[dict]) -> list[dict]:
    for i, message in enumerate(messages):
        marker = next((t for t in TEMPLATE_MARKERS if t in message["content"]), None)
        if marker is not None:
            raise BadRow("template_token", f"turn {i} contains the template token {marker}")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRow("no_assistant_turn", "the conversation has no assistant turn to learn from")
    return messages


# --- sources ---------------------------------------------------------------------------------


def read_source(
    source: SftSourceSection, *, strict: bool, prefix: bool = True
) -> tuple[list[dict], SourceReport]:
    """A source's conversations ({"id", "messages"}: the row's own id, else its place, after
    "SOURCE:" when `prefix`, as in a mix of several) and its report."""
    fmt = None if source.format == "auto" else source.format
    report = SourceReport(source.name, list(source.inputs), fmt or "auto", fmt is None)
    conversations: list[dict] = []
    for spec in source.inputs:
        for where, place, row in rows(spec):
            report.rows += 1
            if isinstance(row, BadRow):
                report.skip(row, where, strict)
                continue
            if fmt is None:
                fmt = detect(row)
                if fmt is None:
                    report.skip(BadRow("unknown_format", _unknown_format(row)), where, strict)
                    continue
                report.format = fmt
                info(f"sft: source {source.name!r} read as {fmt} (told from {where})")
            keys = {**FORMAT_KEYS[fmt], "id": "id", **source.fields}
            try:
                messages = _checked(to_messages(row, fmt, keys))
            except BadRow as problem:
                report.skip(problem, where, strict)
                continue
            own = row.get(keys["id"]) if isinstance(row, dict) else None
            ident = str(own) if own is not None else place
            ident = f"{source.name}:{ident}" if prefix else ident
            conversations.append({"id": ident, "messages": messages})
    report.conversations = len(conversations)
    if not conversations:
        reasons = "; ".join(
            f"{n} {reason} (e.g. {report.examples[reason][0]})"
            for reason, n in report.skipped.most_common(3)
        )
        raise UserError(
            f"sft source {source.name!r} holds no conversation that can be read"
            + (f": {reasons}" if reasons else " (it is empty)"),
            fix=f"check its format ({', '.join(CHAT_FORMATS)}) and `fields`, or its files",
        )
    return conversations, report


def _unknown_format(row: Any) -> str:
    keys = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
    return (
        f"the row's keys ({keys}) are none of the formats' (messages, conversations, "
        "instruction + output): set the source's format and fields"
    )


def mix(read: list[tuple[SftSourceSection, list[dict], SourceReport]], seed: int) -> list[dict]:
    """The conversations of every source: each once without weights; else each source's share
    of as many as all hold together (see the module's docstring)."""
    if not any(source.weight is not None for source, _, _ in read):
        for _, conversations, report in read:
            report.taken, report.epochs = len(conversations), 1.0
        return [c for _, conversations, _ in read for c in conversations]
    total = sum(len(conversations) for _, conversations, _ in read)
    mixed: list[dict] = []
    for index, (source, conversations, report) in enumerate(read):
        want = max(1, round(source.weight * total))
        epochs = want / len(conversations)
        if epochs > source.max_epochs:
            raise UserError(
                f"sft source {source.name!r} holds {len(conversations):,} conversations; its "
                f"weight {source.weight:g} of {total:,} asks for {want:,}: {epochs:.2f} epochs, "
                f"past its max_epochs {source.max_epochs:g}",
                fix="lower its weight, raise its max_epochs, or give it more data",
            )
        rng = np.random.default_rng([seed, index])
        whole, rest = divmod(want, len(conversations))
        picked = [(i, k) for k in range(whole) for i in range(len(conversations))]
        picked += [(int(i), whole) for i in sorted(rng.permutation(len(conversations))[:rest])]
        for i, k in picked:
            c = conversations[i]
            mixed.append(c if k == 0 else {**c, "id": f"{c['id']}{REPEAT}{k + 1}"})
        report.taken, report.epochs = want, round(epochs, 4)
    return mixed


def identity(sources: list[SftSourceSection]) -> list:
    """What stands for the sources' data in the SFT stage's fingerprint: each file by path,
    size and time, each hf: id by the commit it is read at."""
    out = []
    for source in sources:
        for spec in source.inputs:
            files = input_files(spec)
            if files is None:
                out.append([spec, dataset_repo.input_revisions([spec]).get(spec)])
                continue
            revision = dataset_repo.input_revisions([spec]).get(spec)
            out.append([spec, revision, [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns]
                                         for p in files]])  # fmt: skip
    return out


def read_all(
    sources: list[SftSourceSection], *, strict: bool, seed: int
) -> tuple[list[dict], dict[str, dict]]:
    """The mixed conversations of every source, and each source's report (as_dict)."""
    read = []
    for source in sources:
        conversations, report = read_source(source, strict=strict, prefix=len(sources) > 1)
        read.append((source, conversations, report))
    mixed = mix(read, seed)
    for _, _, report in read:
        if report.skipped:
            listed = ", ".join(f"{n:,} {reason}" for reason, n in report.skipped.most_common())
            warn(f"sft: source {report.name!r}: rows skipped ({listed}; see sft's data report)")
    return mixed, {report.name: report.as_dict() for _, _, report in read}
