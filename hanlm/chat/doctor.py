"""`hanlm doctor MODEL_DIR`: what would keep this chat model from ending its answers?

Works on any Hugging Face causal LM folder (safetensors weights, no custom code). Checks:

* the chat template against the tokenizer: every special-looking token it writes is one token
  of the vocabulary, and which token ends an assistant turn;
* padding against the end tokens: a pad id equal to an end token is masked out of the loss by
  collators that ignore padding, so the model never learns to stop;
* generation_config's eos ids against the template's end-of-turn: generation that does not
  stop on it runs to the token limit;
* under-trained end tokens (Land & Bartolo 2024, "Fishing for Magikarp"; hanlm.chat.tokens):
  the unembedding row's cosine to unused reference rows (tied and untied), and for untied
  models the input embedding's norm. Role tokens are only inputs, so their rows are noted,
  not judged;
* a LoRA fine-tune (hanlm's export keeps the adapter in adapter/, PEFT's adapter_config.json):
  which embedding rows it trained (trainable_token_indices); an end token it froze and that
  looks untrained is the field's failure, named with its fix.

`diagnose` returns the findings; `problems` among them make the CLI exit 1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rich.table import Table

from hanlm.chat import tokens
from hanlm.console import console
from hanlm.inference import load_folder
from hanlm.model_folder import ADAPTER_FOLDER

MARK = "HANLM_DOCTOR_ANSWER"
# special-looking pieces of rendered template text: <|eot|>, <|im_end|>, <s>, [INST]
TOKEN_PATTERN = re.compile(r"<\|[A-Za-z0-9_.\-]+\|>|</?[a-z_]+>|\[/?[A-Z_]+\]")
SAMPLE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
]


def _finding(level: str, check: str, what: str, fix: str = "") -> dict:
    return {"level": level, "check": check, "what": what, "fix": fix}


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list | tuple) else [value])]


def _end_of_turn(tokenizer) -> tuple[int | None, str | None]:
    """The token the template writes right after an assistant answer."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": MARK}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if MARK not in text:
        return None, None
    rest = text[text.index(MARK) + len(MARK) :]
    ids = tokenizer(rest, add_special_tokens=False)["input_ids"]
    if not ids:
        return None, None
    special = set(tokenizer.all_special_ids) | {
        i for i, t in tokenizer.added_tokens_decoder.items() if t.special
    }
    return (ids[0], tokenizer.convert_ids_to_tokens(ids[0])) if ids[0] in special else (None, None)


def _special_dict(tokenizer, template_tokens: list[str], end_ids: list[int]) -> dict:
    """hanlm's special_tokens.json shape for hanlm.chat.tokens: named tokens and the reference
    (unused: special, but not written by the template nor used as bos/eos/pad/unk)."""
    named: dict = {}
    for attr in ("bos", "eos", "pad", "unk"):
        token_id = getattr(tokenizer, f"{attr}_token_id")
        if token_id is not None:
            named[attr] = {"token": tokenizer.convert_ids_to_tokens(token_id), "id": token_id}
    vocab = tokenizer.get_vocab()
    for k, token in enumerate(template_tokens):
        if token in vocab:
            named[f"template_{k}"] = {"token": token, "id": vocab[token]}
    for k, token_id in enumerate(end_ids):
        named[f"end_{k}"] = {"token": tokenizer.convert_ids_to_tokens(token_id), "id": token_id}
    used = {v["id"] for v in named.values()}
    reference = [
        {"token": t.content, "id": i}
        for i, t in tokenizer.added_tokens_decoder.items()
        if t.special and i not in used
    ]
    return {**named, "reserved": reference}


def diagnose(model_dir: Path) -> dict:
    model_dir = Path(model_dir)
    loaded = load_folder(
        model_dir, quiet=True, failure="cannot load {path}", fix="check the folder's files"
    )
    model, tokenizer = loaded.model, loaded.tokenizer
    generation_path = loaded.path / "generation_config.json"
    generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
    eos_ids = _ids(generation.get("eos_token_id", model.config.eos_token_id))
    pad_ids = set(
        _ids(tokenizer.pad_token_id)
        + _ids(model.config.pad_token_id)
        + _ids(generation.get("pad_token_id"))
    )
    findings, eot_id, eot_token, template_tokens = _check_template(tokenizer)
    ends = set(eos_ids) | ({eot_id} if eot_id is not None else set())
    findings += _check_padding(tokenizer, pad_ids, ends)
    findings += _check_generation_eos(eos_ids, eot_id, eot_token)
    lora_rows = _lora_trained_rows(loaded.path)
    findings += _check_lora(lora_rows, tokenizer, sorted(ends))
    findings += _check_under_trained(model, tokenizer, template_tokens, sorted(ends), lora_rows)
    problems = sum(f["level"] == "problem" for f in findings)
    return {
        "model": str(model_dir),
        "healthy": problems == 0,
        "problems": problems,
        "end_of_turn": eot_token,
        "eos_token_ids": eos_ids,
        "findings": findings,
    }


def _check_template(tokenizer) -> tuple[list[dict], int | None, str | None, list[str]]:
    """The chat template against the tokenizer: (findings, end-of-turn id and token, the
    special-looking tokens the template writes)."""
    if not tokenizer.chat_template:
        note = _finding(
            "note",
            "chat template",
            "the tokenizer has no chat template (a base model?)",
            "add one to tokenizer_config.json before chat fine-tuning",
        )
        return [note], None, None, []
    findings: list[dict] = []
    eot_id, eot_token = None, None
    template = tokenizer.chat_template
    template = template if isinstance(template, str) else json.dumps(template)
    vocab = tokenizer.get_vocab()
    try:
        rendered = tokenizer.apply_chat_template(SAMPLE, tokenize=False)
    except Exception:  # some templates refuse a system turn
        rendered = tokenizer.apply_chat_template(SAMPLE[1:], tokenize=False)
    template_tokens = sorted(set(TOKEN_PATTERN.findall(template + "\n" + rendered)))
    missing = [t for t in template_tokens if t not in vocab]
    if missing:
        findings.append(
            _finding(
                "problem",
                "chat template",
                f"the template writes {', '.join(missing)}, which the tokenizer lacks: "
                "they become several ordinary tokens",
                "add them as special tokens (and rows to the model), or fix the template",
            )
        )
    try:
        eot_id, eot_token = _end_of_turn(tokenizer)
    except Exception as e:  # a template that cannot render is itself the finding
        findings.append(_finding("problem", "chat template", f"does not render: {e}"))
    if eot_id is None and not missing:
        findings.append(
            _finding(
                "problem",
                "chat template",
                "an assistant answer is not followed by a special end-of-turn token",
                "end each assistant turn with a reserved token such as <|eot|>",
            )
        )
    else:
        findings.append(_finding("ok", "chat template", f"turns end with {eot_token}"))
    return findings, eot_id, eot_token, template_tokens


def _check_padding(tokenizer, pad_ids: set[int], ends: set[int]) -> list[dict]:
    """Padding against the end tokens."""
    clash = sorted(pad_ids & ends)
    if clash:
        return [
            _finding(
                "problem",
                "padding",
                f"the padding token {tokenizer.convert_ids_to_tokens(clash[0])} (id {clash[0]}) "
                "is also an end token: collators that mask padding drop it from the loss",
                "use a dedicated padding token (hanlm: <|pad|>) in tokenizer_config.json, "
                "config.json and generation_config.json",
            )
        ]
    if pad_ids:
        return [_finding("ok", "padding", "padding differs from every end token")]
    return []


def _check_generation_eos(eos_ids: list[int], eot_id: int | None, eot_token) -> list[dict]:
    """generation_config's eos against the template's end-of-turn."""
    if eot_id is None:
        return []
    if eot_id in eos_ids:
        return [_finding("ok", "generation_config", f"eos includes {eot_token}")]
    return [
        _finding(
            "problem",
            "generation_config",
            f"eos_token_id {eos_ids} lacks the end-of-turn {eot_token} (id {eot_id}): "
            "generation runs on to the token limit",
            f"set generation_config.json eos_token_id to [{eot_id}"
            + "".join(f", {i}" for i in eos_ids if i != eot_id)
            + "]",
        )
    ]


def _lora_trained_rows(model_dir: Path) -> set[int] | None:
    """The embedding rows a LoRA fine-tune trained (its adapter's trainable_token_indices), or
    None when the folder is not a LoRA export."""
    path = model_dir / ADAPTER_FOLDER / "adapter_config.json"
    if not path.is_file():
        return None
    indices = json.loads(path.read_text()).get("trainable_token_indices") or []
    if isinstance(indices, dict):  # {module name: rows}
        indices = [i for rows in indices.values() for i in rows]
    return {int(i) for i in indices}


def _check_lora(lora_rows: set[int] | None, tokenizer, end_ids: list[int]) -> list[dict]:
    if lora_rows is None:
        return []
    frozen = [tokenizer.convert_ids_to_tokens(i) for i in end_ids if i not in lora_rows]
    if not frozen:
        return [
            _finding("ok", "lora", f"a LoRA fine-tune that trained the rows of {len(lora_rows)} "
                     "tokens, the end tokens among them")
        ]  # fmt: skip
    return [
        _finding(
            "note",
            "lora",
            f"a LoRA fine-tune that froze the embedding rows of {', '.join(frozen)}: they are "
            "as pretraining (and any initialisation) left them",
            "if they never appeared in pretraining, train them (hanlm: sft.train_new_token_rows "
            "= true; PEFT: trainable_token_indices)",
        )
    ]


def _check_under_trained(
    model, tokenizer, template_tokens: list[str], end_ids: list[int], lora_rows: set[int] | None
):
    """End tokens judged, role tokens noted, by their rows against the unused tokens'."""
    special = _special_dict(tokenizer, template_tokens, end_ids)
    judged = {v["id"]: v["token"] for k, v in special.items() if k.startswith("end_")}
    noted = {
        v["id"]: v["token"]
        for k, v in special.items()
        if k.startswith("template_") and v["id"] not in judged
    }
    ids = list(judged) + list(noted)
    if not ids:
        return []
    findings: list[dict] = []
    geo = tokens.geometry(model, ids, special)
    for token_id, flag in zip(ids, geo["under_trained"], strict=True):
        name = judged.get(token_id) or noted[token_id]
        if flag is None:
            continue
        if flag and token_id in judged:
            fix = (
                "initialise it before SFT (hanlm sft --init mean) and train it on every "
                "assistant turn's end"
            )
            if lora_rows is not None and token_id not in lora_rows:
                fix = (
                    "this LoRA fine-tune froze its rows: fine-tune again with them trained "
                    "(sft.train_new_token_rows = true, PEFT's trainable_token_indices) and "
                    "initialised (sft.init = mean)"
                )
            findings.append(
                _finding(
                    "problem",
                    "under-trained",
                    f"the end token {name} looks untrained (its rows sit with the unused "
                    "tokens'): the model will not emit it",
                    fix,
                )
            )
        elif flag:
            findings.append(
                _finding(
                    "note",
                    "under-trained",
                    f"the role token {name} has rows like the unused tokens' (it is only "
                    "ever an input, so this matters only if SFT never saw it)",
                    "initialise role tokens before SFT (hanlm sft --init mean)",
                )
            )
        elif token_id in judged:
            findings.append(_finding("ok", "under-trained", f"{name} looks trained"))
    if all(f is None for f in geo["under_trained"]):
        findings.append(
            _finding(
                "note",
                "under-trained",
                "no unused reference tokens to compare rows with; not checked",
            )
        )
    return findings


def print_report(report: dict) -> None:
    table = Table(title=f"doctor: {report['model']}")
    for column in ("", "check", "finding", "fix"):
        table.add_column(column)
    marks = {"problem": "[red]✗[/red]", "note": "[yellow]![/yellow]", "ok": "[green]✓[/green]"}
    for f in report["findings"]:
        table.add_row(marks[f["level"]], f["check"], f["what"], f["fix"])
    console.print(table)
    if report["healthy"]:
        console.print("[green]healthy[/green]: nothing keeps this model from ending its answers")
    else:
        console.print(f"[red]{report['problems']} problem(s)[/red]: see the fixes above")
