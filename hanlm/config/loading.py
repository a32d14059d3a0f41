"""The configuration as a whole: `Config` (every section, and the settings that must go together
across sections), and its life: TOML in, `--set section.key=value` overrides, resolved TOML out.

Unknown keys and bad values are `UserError`s that name the key and the valid choices. The
sections themselves are in the package's other modules (data, training, sft, serving, launch).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, get_args

import tomli_w
from pydantic import BaseModel, Field, ValidationError, model_validator
from rich.markup import escape

from hanlm import ranks
from hanlm.config.base import RunSection, Section
from hanlm.config.data import (
    CorpusSection,
    DataEngineSection,
    DecontamSection,
    DemoSection,
    ShardsSection,
    TokenizerSection,
)
from hanlm.config.launch import LaunchSection, PlanSection, PreflightSection
from hanlm.config.serving import EvalSection, GenerateSection, PublishSection, ServeSection
from hanlm.config.sft import SftSection
from hanlm.config.training import (
    CheckpointSection,
    DistillSection,
    LoggingSection,
    ModelSection,
    OptimizerSection,
    ParallelSection,
    PrecisionSection,
    PretrainSection,
)
from hanlm.console import warn
from hanlm.errors import UserError
from hanlm.files import atomic_write_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

RECIPES_DIR = Path(__file__).parent.parent / "configs"  # hanlm/configs
DEFAULT_RECIPE = "demo"


class Config(Section):
    run: RunSection = Field(default_factory=RunSection)
    plan: PlanSection = Field(default_factory=PlanSection)
    launch: LaunchSection = Field(default_factory=LaunchSection)
    demo: DemoSection = Field(default_factory=DemoSection)
    corpus: CorpusSection = Field(default_factory=CorpusSection)
    decontam: DecontamSection = Field(default_factory=DecontamSection)
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection)
    shards: ShardsSection = Field(default_factory=ShardsSection)
    data_engine: DataEngineSection = Field(default_factory=DataEngineSection)
    model: ModelSection = Field(default_factory=ModelSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    precision: PrecisionSection = Field(default_factory=PrecisionSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    pretrain: PretrainSection = Field(default_factory=PretrainSection)
    sft: SftSection = Field(default_factory=SftSection)
    preflight: PreflightSection = Field(default_factory=PreflightSection)
    generate: GenerateSection = Field(default_factory=GenerateSection)
    serve: ServeSection = Field(default_factory=ServeSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    publish: PublishSection = Field(default_factory=PublishSection)

    @model_validator(mode="after")
    def _settings_that_go_together(self) -> Config:
        fp8 = self.precision.mode in ("fp8", "fp8-emulate")
        if (
            fp8
            and self.parallel.fsdp_float8_all_gather
            and self.precision.fp8_recipe != "tensorwise"
        ):
            raise ValueError(
                'parallel.fsdp_float8_all_gather needs precision.fp8_recipe = "tensorwise" '
                f"(it is {self.precision.fp8_recipe!r}); set parallel.fsdp_float8_all_gather = "
                "false or use the tensorwise recipe"
            )
        names = [s.name for s in self.corpus.source_list()]
        unknown = [n for n in self.decontam.action_sources if n not in names]
        if unknown:
            raise ValueError(
                f"decontam.action_sources names {', '.join(unknown)}, not a corpus source "
                f"(the sources are {', '.join(names)})"
            )
        lora = [v.name for v in self.sft.variants() if v.method == "lora"]
        if self.sft.optimizer.name == "muon" and lora:
            # the one place Muon meets LoRA: refused here, never changed on the way
            raise ValueError(
                f'sft.optimizer.name = "muon" with LoRA ({", ".join(lora)}: sft.method or a '
                "variant of sft.compare): LoRA's adapters are low-rank factors, not the "
                'matrices Muon orthogonalises; use sft.optimizer.name = "adamw", or leave '
                'LoRA out (sft.method = "full", no LoRA variant in sft.compare)'
            )
        if self.tokenizer.extend and not self.model.init_from:
            raise ValueError(
                "tokenizer.extend adds tokens to the tokenizer of the model pretraining starts "
                "from, and model.init_from is not set: set model.init_from, or drop "
                "tokenizer.extend (a new tokenizer is trained to tokenizer.vocab_size)"
            )
        if self.distill.enabled and not self.distill.teacher:
            raise ValueError(
                "distill.enabled is true but distill.teacher is not set: give distill.teacher "
                "a Hugging Face model folder, or set distill.enabled = false"
            )
        return self


# --- reading and resolving -------------------------------------------------------------------


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(
            f"config file {path} does not exist",
            fix=f"give a path to a TOML file or one of the built-in recipes: {', '.join(recipe_names())}",
        ) from None
    except IsADirectoryError:
        raise folder_given_as_config(path) from None
    except UnicodeDecodeError:
        raise UserError(
            f"{path} is not a TOML file: it is not UTF-8 text",
            fix="give the recipe's .toml file (TOML is UTF-8 text)",
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}", fix="correct the TOML syntax") from None
    except OSError as e:
        raise UserError(
            f"cannot read config file {path}: {e.strerror or e}",
            fix="check the path and its permissions",
        ) from None


def folder_given_as_config(path: Path, inside: Path | None = None) -> UserError:
    """The error for `--config FOLDER`; `inside`, a config file the folder holds, is the fix."""
    hint = f"--config {inside}" if inside is not None else "a TOML file's path"
    return UserError(
        f"--config {path} is a folder, not a TOML file",
        fix=f"give {hint}, or a built-in recipe: {', '.join(recipe_names())}",
    )


def _exists(run_config: Path | None) -> bool:
    return run_config is not None and Path(run_config).is_file()


def resolve_source(source: str | Path | None, run_config: Path | None) -> Path:
    """Which TOML a stage starts from: the given file or recipe, else `run_config` (the run's own
    config file, which its caller names) when it exists, else the demo recipe."""
    if source is None:
        if _exists(run_config):
            return Path(run_config)
        return RECIPES_DIR / f"{DEFAULT_RECIPE}.toml"
    text = str(source)
    looks_like_recipe = "/" not in text and not text.endswith(".toml")
    recipe = RECIPES_DIR / f"{text}.toml"
    if looks_like_recipe and recipe.is_file():
        return recipe  # a built-in name wins over a file or folder of that name here
    if Path(text).is_dir():
        raise folder_given_as_config(Path(text))
    if looks_like_recipe and not Path(text).is_file():
        raise UserError(
            f"unknown recipe {text!r}",
            fix=f"use one of {', '.join(recipe_names())} or a path to a .toml file",
        )
    return Path(text)


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare string such as `--set corpus.text_field=body`


def _check_path(model: type[BaseModel], keys: list[str], full_key: str) -> None:
    for i, key in enumerate(keys):
        fields = model.model_fields
        if key not in fields:
            where = ".".join(keys[:i]) or "the top level"
            raise UserError(
                f"unknown config key {full_key!r}",
                where=f"{where}",
                fix=f"valid keys there are: {', '.join(sorted(fields))}",
            )
        annotation = fields[key].annotation
        if i < len(keys) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                raise UserError(
                    f"config key {'.'.join(keys[: i + 1])!r} is a value, not a section",
                    fix=f"set it directly, e.g. --set {'.'.join(keys[: i + 1])}=VALUE",
                )
            model = annotation


def _parse_overrides(overrides: list[str]) -> list[tuple[str, Any, str]]:
    """(dotted key, value, the text as given) of each `section.key=value` string."""
    parsed = []
    for text in overrides:
        if "=" not in text:
            raise UserError(
                f"override {text!r} has no '='", fix="write it as --set section.key=value"
            )
        key, raw = text.split("=", 1)
        parsed.append((key.strip(), _parse_value(raw.strip()), text))
    return parsed


def apply_overrides(data: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Apply `section.key=value` strings (or a {dotted key: value} dict) to raw config data."""
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = [(key, value) for key, value, _ in _parse_overrides(overrides)]
    for key, value in items:
        _set_key(data, key, value)
    return data


def _set_key(data: dict[str, Any], key: str, value: Any) -> None:
    keys = key.split(".")
    _check_path(Config, keys, key)
    node = data
    for i, k in enumerate(keys[:-1]):
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            section = ".".join(keys[: i + 1])
            raise UserError(
                f"config key {key!r} cannot be set: the configuration gives {section!r} a "
                f"value ({node!r}) where a section belongs",
                fix=f"make {section} a [{section}] table in the TOML file",
            )
    node[keys[-1]] = value


def _setters_of(loc: tuple, set_by: dict[str, str]) -> list[str]:
    """The overrides that set the value at `loc`, a section holding it, or (for a section's
    own check of how its keys go together) a key inside it; [] when the file set them all."""
    for i in range(len(loc), 0, -1):
        key = ".".join(str(p) for p in loc[:i])
        if key in set_by:
            return [set_by[key]]
    inside = ".".join(str(p) for p in loc) + "." if loc else ""
    return [override for key, override in set_by.items() if key.startswith(inside)]


def _format_validation_error(
    err: ValidationError,
    source: str,
    set_by: dict[str, str] | None = None,
    data: dict[str, Any] | None = None,
) -> UserError:
    """One message for every bad value, located where each was set: the file or an override.
    A key inside a table of an array (`[[corpus.sources]]`) is named by the table's `name`."""
    set_by = set_by or {}
    lines, places = [], []
    for e in err.errors():
        loc = _located(e["loc"], data or {})
        if e["type"] == "extra_forbidden":
            model = _model_at(e["loc"][:-1])
            valid = f" (valid keys: {', '.join(sorted(model.model_fields))})" if model else ""
            lines.append(f"unknown key {loc!r}{valid}")
        elif e["type"] == "value_error":  # a validator's own sentence, naming its keys
            message = e["msg"].removeprefix("Value error, ")
            lines.append(f"{loc}: {message}" if loc else message)
        else:
            lines.append(f"{loc}: {e['msg']} (got {e.get('input')!r})")
        for place in _setters_of(e["loc"], set_by) or [source]:
            if place not in places:
                places.append(place)
    from_file = source in places
    fix = (
        "correct the key or value in the TOML file"
        if from_file and len(places) == 1
        else "correct the value given on the command line"
        if not from_file
        else "correct the values in the TOML file and on the command line"
    )
    return UserError("invalid configuration: " + "; ".join(lines), where=", ".join(places), fix=fix)


def _table_model(annotation: Any) -> type[BaseModel] | None:
    """The section type a field holds, itself or as the items of a list or the values of a
    dict (`X | None`, `list[X]`, `dict[str, X]`); None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):  # dict[str, X]: X is the last
        found = _table_model(arg)
        if found is not None:
            return found
    return None


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The section at a location of the configuration (list indices and dict keys pass
    through to the tables they hold)."""
    model: type[BaseModel] | None = Config
    for part in loc:
        if model is None:
            return None
        field = model.model_fields.get(str(part)) if not isinstance(part, int) else None
        if field is not None:
            model = _table_model(field.annotation)
    return model


def _located(loc: tuple, data: dict[str, Any]) -> str:
    """`loc` as the user wrote it: `corpus.sources[1] ("wiki").text_field`."""
    out, value = "", data
    for part in loc:
        if isinstance(part, int):
            value = value[part] if isinstance(value, list) and part < len(value) else None
            name = value.get("name") if isinstance(value, dict) else None
            out += f"[{part}]" + (f" ({name!r})" if isinstance(name, str) else "")
        else:
            value = value.get(part) if isinstance(value, dict) else None
            out += f".{part}" if out else str(part)
    return out


def _warn_ignored_settings(cfg: Config) -> None:
    """Settings that validate but do nothing in this combination: say so rather than ignore them."""
    if not ranks.is_main():  # under torchrun, say it once
        return
    if cfg.distill.teacher and not cfg.distill.enabled:
        warn(
            f"distill.teacher is set ({escape(cfg.distill.teacher)}) but distill.enabled is false, so "
            "training runs without distillation; set distill.enabled=true to distil, or leave "
            "distill.teacher out"
        )


def load_config(
    source: str | Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    run_config: Path | None = None,
    values: dict[str, Any] | None = None,
    *,
    recipe_fallback: bool = True,
) -> Config:
    """The configuration a stage runs with: file or recipe (else `run_config`, the run's saved
    config file, when it exists), then `values` (from CLI flags), then `overrides` (`--set`),
    validated. Where a run keeps its config is the caller's to say (`RunDir.config`).

    With recipe_fallback=False, no source and no run config start from the documented
    defaults instead of the demo recipe (`hanlm plan` plans real models, not the demo).
    """
    if source is None and not recipe_fallback and not _exists(run_config):
        path, data = "the defaults", {}
    else:
        path = resolve_source(source, run_config)
        data = _read_toml(path)
    set_by = {key: f"the command-line option setting {key}" for key in values or {}}
    if isinstance(overrides, dict):
        set_by.update({key: f"the override {key}={value!r}" for key, value in overrides.items()})
    else:
        set_by.update({key: f"--set {text}" for key, _, text in _parse_overrides(overrides or [])})
    if "corpus.inputs" in set_by and "corpus.sources" not in set_by:
        # inputs given on the command line replace the file's sources, as any flag its key
        data.get("corpus", {}).pop("sources", None)
    if "sft.data" in set_by and "sft.sources" not in set_by:
        data.get("sft", {}).pop("sources", None)  # the same for the chat data, both ways
    if "sft.sources" in set_by and "sft.data" not in set_by:
        data.get("sft", {}).pop("data", None)
    if "model.init_from" in set_by and "model.preset" not in set_by:
        data.get("model", {}).pop("preset", None)  # the model given replaces the file's preset
    if "model.preset" in set_by and "model.init_from" not in set_by:
        data.get("model", {}).pop("init_from", None)
    apply_overrides(data, values or {})
    apply_overrides(data, overrides or [])
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise _format_validation_error(err, str(path), set_by, data) from None
    _warn_ignored_settings(cfg)
    return cfg


def config_to_toml(cfg: Config) -> str:
    data = cfg.model_dump(mode="json", exclude_none=True)
    if cfg.corpus.sources:  # the sources hold the inputs; both set is an error when read back
        del data["corpus"]["inputs"]
    if cfg.model.init_from:  # likewise: the model brings its architecture
        del data["model"]["preset"]
    return tomli_w.dumps(data)


def save_config(cfg: Config, path: Path) -> Path:
    """Write the resolved configuration to the TOML file `path` (a run's is `RunDir.config`)."""
    path = Path(path)
    atomic_write_text(path, config_to_toml(cfg))
    return path
