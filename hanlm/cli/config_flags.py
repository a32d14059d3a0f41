"""Command-line flags generated from the configuration models: one flag per config key.

A command exposes config sections (or single keys); each field becomes `--field-name`, with its
type, choices, description and default taken from the pydantic model, and sets `section.field`
as the TOML file or `--set section.field=VALUE` would. Values are checked by the model when the
configuration loads, so a bad one is the same UserError (key, valid choices, exit status 2)
whether it came from a flag, `--set` or the file.

Where a flag is spelled otherwise than its field, the field says so in
`Field(json_schema_extra={"cli": {...}})`:

    flag     the flag's name without dashes (default: the field's name, `_` written `-`), or
             False for a key that only the pipeline reads (set it with --set)
    aliases  further spellings without dashes, e.g. ["model-config"]
    metavar  the value's placeholder in the help, e.g. "GLOB"
    const    the value of the flag given alone (its value is then optional), e.g. "full"
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

if TYPE_CHECKING:  # no pydantic at import: `hanlm --help` imports this module and no model
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

CONFIG_KEYS = "config_keys"  # the parsed namespace's list of the keys its flags set


def expand(model: type[BaseModel], selectors: Iterable[str]) -> list[str]:
    """The dotted keys that `selectors` name, in order: `section` is each of its fields (and
    those of the sections inside it), `section.key` that one field, `-section.key` takes one out."""
    keys: list[str] = []
    for selector in selectors:
        if selector.startswith("-"):
            keys.remove(selector[1:])
        elif _is_section(field_at(model, selector).annotation):
            keys += _section_keys(field_at(model, selector).annotation, selector)
        else:
            keys.append(selector)
    return keys


def _section_keys(section: type[BaseModel], prefix: str) -> list[str]:
    keys = []
    for name, field in section.model_fields.items():
        if _is_section(field.annotation):
            keys += _section_keys(field.annotation, f"{prefix}.{name}")
        elif _cli(field).get("flag", True) is not False:  # False: a key only for --set
            keys.append(f"{prefix}.{name}")
    return keys


def field_at(model: type[BaseModel], key: str) -> FieldInfo:
    """The field of a dotted key (a section is a field too)."""
    field: FieldInfo | None = None
    for name in key.split("."):
        if field is not None:
            model = field.annotation
        if not isinstance(model, type) or name not in model.model_fields:
            raise KeyError(f"no config key {key!r}")
        field = model.model_fields[name]
    assert field is not None, "an empty key"
    return field


def add_config_flags(
    parser: argparse.ArgumentParser, model: type[BaseModel], selectors: Iterable[str]
) -> None:
    """Add a flag for each key `selectors` name, grouped by section; `flag_values` reads them."""
    keys = expand(model, selectors)
    groups: dict[str, Any] = {}
    for key in keys:
        section = key.rsplit(".", 1)[0]
        if section not in groups:
            groups[section] = parser.add_argument_group(
                f"[{section}] settings",
                f"Each flag sets {section}.KEY, as --set {section}.KEY=VALUE would; a key not given "
                "keeps the value\nof the configuration loaded (see --config), else the default shown.",
            )
        names, options = argument(key, field_at(model, key))
        groups[section].add_argument(*names, dest=key, **options)
    parser.set_defaults(**{CONFIG_KEYS: keys})


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """{dotted key: value} of the config flags given on the command line."""
    values = {key: getattr(args, key) for key in getattr(args, CONFIG_KEYS, [])}
    return {key: value for key, value in values.items() if value is not None}


def flag_name(key: str, field: FieldInfo) -> str:
    """`--name`: the field's `flag` metadata, else its name with `-` for `_`."""
    return "--" + (_cli(field).get("flag") or _field_name(key)).replace("_", "-")


def _field_name(key: str) -> str:
    return key.rsplit(".", 1)[1]


def argument(key: str, field: FieldInfo) -> tuple[list[str], dict[str, Any]]:
    """The option strings and `add_argument` options of one config key's flag. Every default is
    None, so that a flag not given leaves the key to the file."""
    cli = _cli(field)
    names = [flag_name(key, field), *("--" + alias for alias in cli.get("aliases", []))]
    value_type, repeatable = _unwrap(field.annotation)
    options: dict[str, Any] = {"default": None, "help": _help(key, field, repeatable)}
    if value_type is bool:
        return names, {**options, "action": argparse.BooleanOptionalAction}
    if get_origin(value_type) is Literal:
        # not argparse's choices: the model checks the value, with the same message as --set's
        choices = ",".join(str(c) for c in get_args(value_type))
        options["metavar"] = cli.get("metavar") or "{" + choices + "}"
        value_type = str
    elif value_type in (int, float, str):
        default = _METAVARS.get(value_type) or _field_name(key).upper()
        options["metavar"] = cli.get("metavar") or default
    else:
        raise TypeError(f"{key}: no command-line form for {field.annotation!r}")
    options["type"] = value_type
    if repeatable:
        options["action"] = "append"
    if "const" in cli:
        options.update(nargs="?", const=cli["const"])
    return names, options


_METAVARS = {int: "N", float: "X"}


def _help(key: str, field: FieldInfo, repeatable: bool) -> str:
    """The field's description, then in brackets: the key where the flag is named otherwise,
    whether it repeats, and the model's default."""
    notes = []
    if "flag" in _cli(field):
        notes.append(f"sets {key}")
    if repeatable:
        notes.append("repeatable")
    shown = _shown_default(field.get_default(call_default_factory=True))
    if shown is not None:
        notes.append(f"default: {shown}")
    text = field.description or ""
    if notes:
        text = f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)
    return text.replace("%", "%%")  # argparse %-formats help


def _shown_default(default: Any) -> str | None:
    """The model's default as a user would type it; None when there is nothing to show."""
    if default is None or default == []:
        return None  # unset: the description says what happens then
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, int) and abs(default) >= 10_000:
        return f"{default:_}"  # 200_000_000: Python's int() and TOML both read it
    if isinstance(default, list):
        text = " ".join(str(v) for v in default)
        return text if len(text) <= 30 else f"{len(default)} built-in values"
    return str(default)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type of one value, whether the key holds a list) of a field's annotation."""
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            annotation = inner[0]
    if get_origin(annotation) is list:
        return get_args(annotation)[0], True
    return annotation, False


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and hasattr(annotation, "model_fields")


CLI_METADATA = {"flag", "aliases", "metavar", "const"}


def _cli(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    cli = extra.get("cli", {}) if isinstance(extra, dict) else {}
    if unknown := set(cli) - CLI_METADATA:
        raise ValueError(f"unknown command-line metadata {sorted(unknown)} on {field!r}")
    return cli
