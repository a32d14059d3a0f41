"""`hanlm generate`: prompts read from a file, answers written as JSONL.

Loading, decoding and hanlm's logits processors live in hanlm.inference; this module is the
command's input and output.
"""

from __future__ import annotations

import json
from pathlib import Path

from hanlm.errors import UserError
from hanlm.files import atomic_write_text


def read_prompts(path: str | Path) -> list[str | list[dict[str, str]]]:
    """Prompts from a file: .jsonl rows with "prompt" (text) or "messages" (a conversation),
    otherwise one prompt per non-empty line."""
    path = Path(path)
    layout = (
        'a text file with one prompt per line, or a .jsonl file with "prompt" or "messages" '
        "on each line"
    )
    if not path.is_file():
        raise UserError(f"prompts file {path} does not exist", fix=f"give {layout}")
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(
            f"prompts file {path} is not UTF-8 text (byte {e.start})", fix=f"give {layout}"
        ) from None
    if path.suffix != ".jsonl":
        prompts = [line for line in lines if line.strip()]
    else:
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(
                    f"invalid JSON: {e.msg}", where=f"{path}:{number}", fix=f"give {layout}"
                ) from None
            value = row.get("messages", row.get("prompt")) if isinstance(row, dict) else None
            if not (isinstance(value, str) or _is_conversation(value)):
                raise UserError(
                    'a row needs "prompt" (a string) or "messages" (a list of {role, content})',
                    where=f"{path}:{number}",
                    fix=f"give {layout}",
                )
            prompts.append(value)
    if not prompts:
        raise UserError(f"prompts file {path} holds no prompt", fix=f"give {layout}")
    return prompts


def _is_conversation(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )


def write_results(path: str | Path, results: list[dict]) -> Path:
    """The results as JSONL (prompt, text, token_ids, new_tokens, finish_reason), atomically."""
    lines = [json.dumps(r, ensure_ascii=False) for r in results]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return Path(path)
