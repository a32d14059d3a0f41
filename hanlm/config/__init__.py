"""Typed configuration of every stage: one pydantic model per TOML section, and `Config`, which
holds them all. TOML in, `--set section.key=value` overrides, resolved TOML out; unknown keys
and bad values are `UserError`s that name the key and the valid choices.

Every key is documented in its section's model:

    base.py      the Section base, the device spelling, source names and shares; [run]
    data.py      [demo], [corpus] (quality, sources), [data_engine], [decontam], [tokenizer],
                 [shards]
    training.py  [model], [optimizer], [precision], [parallel], [checkpoint], [logging],
                 [pretrain], [distill]
    sft.py       [sft] (sources, lora, compare, and its own optimizer, checkpoint and logging)
    serving.py   [generate], [serve], [eval], [publish]
    launch.py    [plan], [preflight], [launch]
    loading.py   Config (the checks across sections), recipes, reading, overrides, saving

What the rest of hanlm uses is imported from here; pydantic comes with it, so the command line
imports this package only once a command is parsed (`hanlm --help` does not).
"""

from hanlm.config.base import EPOCHS_WARNING
from hanlm.config.data import (
    DEFAULT_SOURCE,
    CorpusQualitySection,
    CorpusSection,
    CorpusSourceSection,
    DataEngineSection,
    ShardsSection,
    SourceFields,
)
from hanlm.config.launch import PlanSection
from hanlm.config.loading import (
    Config,
    config_to_toml,
    folder_given_as_config,
    load_config,
    recipe_names,
    save_config,
)
from hanlm.config.serving import GenerateSection, ServeSection
from hanlm.config.sft import (
    CHAT_FORMATS,
    LORA_TARGETS_DEFAULT,
    SftLoraSection,
    SftSection,
    SftSourceSection,
    SftVariant,
)
from hanlm.config.training import (
    CheckpointSection,
    DistillSection,
    LoggingSection,
    OptimizerSection,
    ParallelSection,
    PrecisionSection,
    PretrainSection,
)

__all__ = [
    "CHAT_FORMATS",
    "DEFAULT_SOURCE",
    "EPOCHS_WARNING",
    "LORA_TARGETS_DEFAULT",
    "CheckpointSection",
    "Config",
    "CorpusQualitySection",
    "CorpusSection",
    "CorpusSourceSection",
    "DataEngineSection",
    "DistillSection",
    "GenerateSection",
    "LoggingSection",
    "OptimizerSection",
    "ParallelSection",
    "PlanSection",
    "PrecisionSection",
    "PretrainSection",
    "ServeSection",
    "SftLoraSection",
    "SftSection",
    "SftSourceSection",
    "SftVariant",
    "ShardsSection",
    "SourceFields",
    "config_to_toml",
    "folder_given_as_config",
    "load_config",
    "recipe_names",
    "save_config",
]
