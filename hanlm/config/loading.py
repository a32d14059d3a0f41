"""Typed configuration of every stage: TOML in, `--set section.key=value` overrides, resolved TOML out.

Unknown keys and bad values are `UserError`s that name the key and the valid choices.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)
from rich.markup import escape

from hanlm.console import warn
from hanlm.errors import UserError
from hanlm.files import atomic_write_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

RECIPES_DIR = Path(__file__).parent.parent / "configs"  # hanlm/configs
DEFAULT_RECIPE = "demo"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(Section):
    """Settings shared by every stage."""

    seed: int = Field(0, description="seed of every random choice in the run")


class DemoSection(Section):
    """The built-in synthetic Korean world used when a corpus input is `demo`."""

    seed: int = Field(0, description="seed of the generator; the same seed gives the same world")
    size_mb: float = Field(4.0, gt=0, le=512, description="approximate UTF-8 size of the corpus")
    reverse_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of the facts (a seeded pick) also stated object first in the "
        "documents; the direction probe compares them with the rest",
    )


_FW2 = "FineWeb-2 configs/kor_Hang.yml"
_NO_FLAG: dict[str, Any] = {"cli": {"flag": False}}  # only --set corpus.quality.KEY=VALUE


def _share(default: float, description: str) -> Any:
    return Field(default, ge=0, le=1, description=description, json_schema_extra=_NO_FLAG)


class CorpusQualitySection(Section):
    """[corpus.quality]: keep/drop checks for Korean web text (hanlm/data/quality.py), each
    dropped document counted under its check's name in corpus/stats.json. A threshold of 0 turns
    its check off.

    Defaults follow FineWeb-2's Korean settings (github.com/huggingface/fineweb-2,
    configs/kor_Hang.yml, applied by fineweb-2-pipeline.py through datatrove's Gopher repetition
    and FineWeb quality filters). FineWeb-2 counts Korean words as Kiwi morphemes; these checks
    count whitespace words (eojeol, about 2.2 morphemes each), so the word-based values are
    re-derived: see each description.
    """

    enabled: bool = Field(
        False,
        description="run the quality checks (off in the demo, on in the field recipe)",
        json_schema_extra={"cli": {"flag": "quality"}},
    )
    min_korean_share: float = _share(
        0.3,
        "drop below this share of Hangul among letters (not_korean); ours, in place of "
        "FineWeb-2's GlotLID language score (kor_Hang: 0.842). A syllable is worth 2-3 Latin "
        "letters: Korean with English terms sits at 0.5, Wikipedia at 0.6 (1st percentile)",
    )
    max_boilerplate_share: float = _share(
        0.3,
        "drop above this share of characters in boilerplate lines: copyright, site policy, "
        "login/menu, cookie/JavaScript notices (boilerplate); ours, after C4's line rules",
    )
    max_repeated_paragraph_share: float = _share(
        0.3, "paragraphs that repeat an earlier one (repeated_paragraphs); Gopher's 0.30"
    )
    max_repeated_paragraph_chars: float = _share(
        0.2, "characters in repeated paragraphs (repeated_paragraph_chars); Gopher's 0.20"
    )
    max_repeated_line_share: float = _share(
        0.374, f"lines that repeat an earlier one (repeated_lines); {_FW2} dup_line_frac"
    )
    max_repeated_line_chars: float = _share(
        0.1,
        "characters in repeated lines (repeated_line_chars); FineWeb-2's char_duplicates_ratio",
    )
    min_line_punctuation_share: float = _share(
        0.062,
        f"lines ending in sentence punctuation (line_punctuation); {_FW2} line_punct_thr",
    )
    max_short_line_share: float = Field(
        1.0,
        ge=0,
        le=1,
        description="lines of at most short_line_chars (short_lines); 1 = off, as in FineWeb-2 "
        "(FineWeb English: 0.67)",
        json_schema_extra=_NO_FLAG,
    )
    short_line_chars: int = Field(
        30, ge=1, le=10_000, description="a short line's length", json_schema_extra=_NO_FLAG
    )
    max_line_breaks_per_word: float = Field(
        0.45,
        ge=0,
        le=100,
        description="line breaks per word (line_breaks); FineWeb-2 new_line_ratio 0.196 per "
        "Kiwi token, times 2.3 Kiwi tokens per eojeol (measured on KorQuAD)",
        json_schema_extra=_NO_FLAG,
    )
    # FineWeb-2 kor_Hang top_n_grams (2: 0.282, 3: 0.228, 4: 0.185) are Kiwi-token n-grams; an
    # eojeol n-gram spans more characters, so the same share means more repetition. Times 1.3:
    # on 400 KorQuAD paragraphs with sentences, phrases or halves repeated, this matched
    # FineWeb-2's Kiwi-token decisions on 96% (19% dropped against its 18%; times 1.0: 95%, 23%).
    top_2gram_share: float = _share(0.37, "characters of the top word 2-gram (top_ngram_share)")
    top_3gram_share: float = _share(0.30, "characters of the top word 3-gram (top_ngram_share)")
    top_4gram_share: float = _share(0.24, "characters of the top word 4-gram (top_ngram_share)")
    # FineWeb-2 kor_Hang dup_n_grams, unchanged: on the same documents they matched FineWeb-2's
    # Kiwi-token decisions best as they are (97%; times 0.8: 95%, times 1.2: 95%).
    dup_5gram_share: float = _share(
        0.201, "characters in repeated word 5-grams (duplicate_ngram_share)"
    )
    dup_6gram_share: float = _share(0.184, "the same for 6-grams")
    dup_7gram_share: float = _share(0.168, "the same for 7-grams")
    dup_8gram_share: float = _share(0.154, "the same for 8-grams")
    dup_9gram_share: float = _share(0.14, "the same for 9-grams")
    dup_10gram_share: float = _share(0.127, "the same for 10-grams")

    def top_ngram_shares(self) -> list[tuple[int, float]]:
        return [(n, getattr(self, f"top_{n}gram_share")) for n in (2, 3, 4)]

    def duplicate_ngram_shares(self) -> list[tuple[int, float]]:
        return [(n, getattr(self, f"dup_{n}gram_share")) for n in range(5, 11)]


SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def plain_source_name(name: str) -> str:
    """A source's name as every table and file name shows it (corpus and chat sources alike)."""
    if not SOURCE_NAME.fullmatch(name):
        raise ValueError(
            f"source name {name!r} must be 1-64 letters, digits, '_', '.' or '-', starting "
            "with a letter or digit"
        )
    return name


SourceName = Annotated[str, AfterValidator(plain_source_name)]


def _read_amount(value: Any) -> str | int:
    if value in ("needed", "all") or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 1
    ):
        return value
    raise ValueError(
        f'read must be "needed", "all" or a whole number of training tokens >= 1, not {value!r}'
    )


ReadAmount = Annotated[str | int, PlainValidator(_read_amount)]


def _names_once(table: str, sources: list) -> None:
    names = [s.name for s in sources]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{table} names {', '.join(repeated)} more than once")


DEFAULT_SOURCE = "corpus"  # the one source that a flat corpus.inputs list is
WEIGHT_TOLERANCE = 1e-3  # weights are shares: they must sum to 1 within this
EPOCHS_WARNING = 4.0  # past ~4 epochs repeated tokens are worth much less (Muennighoff et al. 2023)


@dataclass(frozen=True)
class SourceFields:
    """Which fields of a source's records hold the text, the record's id, and the metadata
    carried with each document (filters read theirs from it: language_score, url)."""

    text: str = "text"
    id: str = "id"
    metadata: tuple[str, ...] = ()


class CorpusSourceSection(Section):
    """One `[[corpus.sources]]` table: a named source of documents and its share of the
    training tokens. Either every source has a weight or a token count, or none has (then the
    corpus is one pile, each document read once per pass, as with a flat `inputs`)."""

    name: SourceName = Field(
        description="the source's name in every table (letters, digits, _ . -)"
    )
    inputs: list[str] = Field(
        min_length=1,
        description="globs, hf:NAME[@REVISION][:CONFIG]:SPLIT ids or `demo`, as corpus.inputs",
    )
    weight: float | None = Field(
        None, gt=0, le=1, description="share of the training tokens (the weights sum to 1)"
    )
    tokens: int | None = Field(
        None, ge=1, description="training tokens taken from it (instead of a weight)"
    )
    max_epochs: float = Field(
        EPOCHS_WARNING,
        gt=0,
        le=1000,
        description="how often its documents may be repeated to reach its share; a share that "
        "needs more is an error before training",
    )
    min_chars: int | None = Field(None, ge=0, description="corpus.min_chars for this source")
    text_field: str | None = Field(
        None, min_length=1, description="the field holding the text (unset: corpus.text_field)"
    )
    id_field: str = Field(
        "id",
        min_length=1,
        description="the field holding a record's own id, kept as the document's id where the "
        "record has it (else FILE:ROW)",
    )
    metadata: list[str] = Field(
        default_factory=list,
        description='fields carried with each document ({"id", "text", "metadata"} in the '
        'corpus parts and after decontam), e.g. ["url", "language_score"]',
    )
    min_language_score: float | None = Field(
        None,
        ge=0,
        le=1,
        description="drop documents whose `language_score` field (FineWeb-2's) is below this",
    )
    pii: bool | None = Field(None, description="corpus.pii for this source")
    quality: bool | None = Field(
        None, description="corpus.quality.enabled for this source (e.g. off for Wikipedia)"
    )
    read: ReadAmount = Field(
        "needed",
        description='how much of it the corpus stage reads: "needed" (its share of the '
        "training tokens in one pass, times corpus.read_margin, at corpus.chars_per_token; "
        'all of it when that is more), "all", or N training tokens\' worth; drawn as whole '
        "row groups or byte ranges in a seeded order across its files (the demo world and a "
        "source without a share are read whole)",
    )

    @model_validator(mode="after")
    def _one_share(self) -> CorpusSourceSection:
        if self.weight is not None and self.tokens is not None:
            raise ValueError(
                f"source {self.name!r} has both a weight and a token count: give one of them"
            )
        return self

    @property
    def mixed(self) -> bool:
        return self.weight is not None or self.tokens is not None


class CorpusSection(Section):
    """`hanlm corpus`: read, normalise (NFC), clean and deduplicate raw text."""

    inputs: list[str] = Field(
        default_factory=lambda: ["demo"],
        description="globs of .txt/.jsonl/.parquet files (optionally .gz/.zst), "
        "hf:NAME[@REVISION][:CONFIG]:SPLIT dataset ids, or `demo` for the built-in world",
        json_schema_extra={"cli": {"flag": "input", "metavar": "GLOB"}},
    )
    text_field: str = Field("text", min_length=1, description="JSONL/parquet field with the text")
    doc_per_line: bool = Field(False, description=".txt: one document per line, not per block")
    min_chars: int = Field(20, ge=0, description="documents shorter than this are dropped")
    max_document_chars: int = Field(
        8_000_000,
        ge=0,
        description="longer documents are cut into documents of at most this many characters, "
        "at paragraph, line or word breaks (or dropped: long_documents); it bounds the memory "
        "of every data stage, which holds a document whole; 0 = no limit",
    )
    long_documents: Literal["split", "drop"] = Field(
        "split",
        description="a document over max_document_chars: split it, or drop it (counted in "
        "stats.json; with --strict, an error naming it)",
    )
    near_dedup: bool = Field(False, description="also remove near-duplicates (MinHash LSH)")
    near_dedup_threshold: float = Field(
        0.6,
        gt=0,
        le=1,
        description="estimated Jaccard of the folded character shingles above which two "
        "documents are one: 0.6 keeps 95% of copies with one sentence in 8-16 changed "
        "(benchmarks/corpus.py); punctuation, spacing and case are folded before",
    )
    near_dedup_num_perm: int = Field(128, ge=16, le=1024)
    near_dedup_ngram: int = Field(5, ge=1, le=32, description="character shingle length")
    strict: bool = Field(False, description="fail on the first corrupt line instead of skipping")
    part_chars: int = Field(
        64_000_000, ge=1000, description="characters per output part (the unit of shard work)"
    )
    quality: CorpusQualitySection = Field(default_factory=CorpusQualitySection)
    url_blocklist: str | None = Field(
        None,
        description="a file of domains, one a line (# comments): documents whose `url` field "
        "is on one of them or a subdomain are dropped (read `url` as a source's metadata)",
    )
    pii: bool = Field(
        True,
        description="replace e-mails, public IPs, Korean phone and resident registration "
        "numbers with fixed strings (hanlm/data/pii.py); counted in stats.json",
    )
    read_margin: float = Field(
        1.3,
        ge=1,
        le=10,
        description='a source read "needed" is read this much beyond its share: what '
        "cleaning, deduplication and decontamination remove, and the error of chars_per_token",
    )
    chars_per_token: float = Field(
        2.5,
        gt=0,
        le=100,
        description="characters of text per training token, to turn a share into text to read "
        "(a 32-64k byte-level BPE trained on Korean: ~2.5; the tokenizer stage measures it)",
    )
    sources: list[CorpusSourceSection] = Field(
        default_factory=list,
        description="[[corpus.sources]]: named sources with weights (instead of inputs)",
        json_schema_extra=_NO_FLAG,
    )

    @model_validator(mode="after")
    def _sources_or_inputs(self) -> CorpusSection:
        if not self.sources:
            return self
        if "inputs" in self.model_fields_set:
            raise ValueError(
                "corpus.inputs and [[corpus.sources]] are both set: list the inputs in the "
                "sources (each source has its own inputs), or drop the sources"
            )
        _names_once("[[corpus.sources]]", self.sources)
        mixed = [s.mixed for s in self.sources]
        if any(mixed) and not all(mixed):
            bare = ", ".join(s.name for s in self.sources if not s.mixed)
            raise ValueError(
                f"source(s) {bare} have no weight or tokens while others do: give every "
                "source a weight or a token count, or none of them (one pile)"
            )
        weights = [s.weight for s in self.sources if s.weight is not None]
        if weights and abs(sum(weights) - 1.0) > WEIGHT_TOLERANCE:
            listed = " + ".join(f"{w:g}" for w in weights)
            raise ValueError(
                f"the source weights sum to {sum(weights):.4g} ({listed}), not 1: weights "
                "are shares of the training tokens (sources with a token count take theirs "
                "first, the weighted ones share the rest)"
            )
        return self

    def source_list(self) -> list[CorpusSourceSection]:
        """The sources, or the flat `inputs` as one source named "corpus"."""
        if self.sources:
            return list(self.sources)
        return [CorpusSourceSection(name=DEFAULT_SOURCE, inputs=list(self.inputs))]

    def fields_of(self, source: CorpusSourceSection) -> SourceFields:
        """The fields a source's records are read by (its own, else the corpus's)."""
        wanted = list(source.metadata)
        if source.min_language_score is not None and "language_score" not in wanted:
            wanted.append("language_score")
        if self.url_blocklist and "url" not in wanted:
            wanted.append("url")
        return SourceFields(source.text_field or self.text_field, source.id_field, tuple(wanted))

    def all_inputs(self) -> list[str]:
        return [i for s in self.source_list() for i in s.inputs]

    @property
    def is_mixture(self) -> bool:
        """Sources with shares: the mix is realised when training reads the shards."""
        return any(s.mixed for s in self.sources)


class SlurmSection(Section):
    """data_engine.executor = "slurm": each data stage becomes Slurm array jobs (datatrove)."""

    partition: str = Field("", description="Slurm partition; required for the slurm executor")
    time: str = Field("24:00:00", description="time limit of one job (HH:MM:SS)")
    cpus_per_task: int = Field(1, ge=1, le=256)
    mem_per_cpu_gb: float = Field(2.0, gt=0)
    venv_path: str = Field(
        "", description="virtual environment the jobs activate (its bin/activate)"
    )
    sbatch_args: dict[str, str] = Field(
        default_factory=dict, description="more #SBATCH directives, e.g. {account = 'lm'}"
    )


class RaySection(Section):
    """data_engine.executor = "ray": each data stage's tasks run on a Ray cluster (datatrove)."""

    address: str = Field(
        "", description="cluster to join (ray.init address); empty: RAY_ADDRESS or a local Ray"
    )
    cpus_per_task: int = Field(1, ge=1, le=256)
    mem_per_cpu_gb: float = Field(2.0, gt=0)


class DataEngineSection(Section):
    """The engine the data stages (corpus, decontam, shards) run their per-document work on:
    datatrove's executors, with a fixed number of tasks per stage so the output does not depend
    on how many workers run them, and completion markers so a killed stage resumes."""

    executor: Literal["local", "slurm", "ray"] = Field(
        "local", description="local: worker processes on this machine; slurm or ray: a cluster"
    )
    workers: int = Field(
        0, ge=0, le=4096, description="tasks run at once; 0 = one per CPU core (local) or no limit"
    )
    task_mb: int = Field(
        64, ge=1, le=65536, description="input per task (MB): the unit of work, resume and memory"
    )
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    ray: RaySection = Field(default_factory=RaySection)


class TokenizerSection(Section):
    """`hanlm tokenizer`: byte-level BPE with reserved special tokens."""

    vocab_size: int = Field(65536, ge=512, le=1 << 20, description="padded to a multiple of 64")
    sample_chars: int = Field(200_000_000, ge=1000, description="characters of corpus to train on")
    min_frequency: int = Field(2, ge=1)
    reserved_tokens: int = Field(32, ge=0, le=4096, description="spare special tokens")
    heldout_docs: int = Field(200, ge=1, description="documents kept out to measure compression")
    extend: int = Field(
        0,
        ge=0,
        le=1 << 16,
        description="with model.init_from: new tokens trained on the corpus and added to the "
        "model's tokenizer (0: its tokenizer as it is)",
    )
    extend_init: Literal["pieces", "mean"] = Field(
        "pieces",
        description="a new token's rows: the mean of the model's rows for the pieces its old "
        "tokenizer splits the token's text into, or the mean of every ordinary row",
    )


class ShardsSection(Section):
    """`hanlm shards`: tokenise the corpus into memmap token files."""

    val_fraction: float = Field(
        0.005, ge=0, lt=0.5, description="share of documents held out for validation"
    )
    batch_docs: int = Field(256, ge=1, description="documents per encode call in a task")
    piece_chars: int = Field(
        1 << 20,
        ge=1000,
        description="characters per encode call; a longer document is encoded in pieces cut "
        "before a space, which give the same tokens (a worker holds ~250 bytes per character)",
    )


# --- one device spelling everywhere ----------------------------------------------------------------

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def check_device(value: str) -> str:
    """auto, cpu, cuda or cuda:N: the one device spelling of every section."""
    if value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value or ""):
        return value
    raise ValueError(f"unknown device {value!r}: use {DEVICE_CHOICES}")


Device = Annotated[str, AfterValidator(check_device)]


# --- the training components, shared by pretraining and SFT --------------------------------------


class ModelSection(Section):
    """The model pretraining builds (SFT starts from pretraining's, or from sft.model)."""

    preset: str = Field(
        "demo",
        description="model preset (tiny, demo, 125m, 350m, 1.3b) or a transformers config.json",
        json_schema_extra={"cli": {"aliases": ["model-config"]}},
    )
    init_from: str | None = Field(
        None,
        description="continued pretraining: a Hugging Face causal LM (folder or Hub id) whose "
        "weights, architecture and tokenizer pretraining starts from, instead of model.preset",
    )
    trust_remote_code: bool = Field(
        False,
        description="run the Python code a model folder names in its auto_map (an architecture "
        "transformers does not ship), for init_from, sft.model and every model the run loads; "
        "read that code first",
    )

    @model_validator(mode="after")
    def _preset_or_init_from(self) -> ModelSection:
        if self.init_from and "preset" in self.model_fields_set:
            raise ValueError(
                "model.preset and model.init_from are both set: init_from brings its own "
                "architecture; drop model.preset (or init_from, to train from scratch)"
            )
        return self


class OptimizerSection(Section):
    """AdamW and its learning-rate schedule, for pretraining only.

    SFT does not read this section: [sft.optimizer] is a separate copy of these fields with
    SFT's own defaults, so a value set here (e.g. optimizer.beta2) does not reach SFT; set it
    again as sft.optimizer.KEY to change SFT's."""

    lr: float = Field(3e-4, gt=0, description="peak learning rate")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a share of the peak")
    warmup_steps: int = Field(100, ge=0)
    schedule: Literal["cosine", "wsd"] = Field(
        "cosine", description="cosine, or warm-up-stable-decay"
    )
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps spent decaying")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay (never on norms and biases)")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="max gradient norm; 0 = no clipping")
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description="steps in a row with a non-finite (NaN/inf) loss or gradient norm before "
        "training stops with the diagnosis; each such step's update is skipped",
    )
    name: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw: AdamW on every parameter; muon: Muon on the decoder blocks' "
        "matrices and AdamW (lr, weight_decay, betas) on the embedding, head, norms and biases",
    )
    muon_lr: float | None = Field(
        None, gt=0, description="Muon's peak learning rate (unset: lr), on the same schedule"
    )
    muon_weight_decay: float | None = Field(
        None, ge=0, description="Muon's decoupled weight decay (unset: weight_decay)"
    )
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="Muon's Nesterov momentum")
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw",
        description="Muon's step per matrix: lr x 0.2 sqrt(max(rows, cols)) (Moonlight's: "
        "AdamW's lr and weight decay carry over), or lr x sqrt(max(1, rows/cols)) (Jordan's)",
    )
    muon_ns_steps: int = Field(5, ge=1, le=20, description="Muon's Newton-Schulz iterations")


class SftOptimizerSection(OptimizerSection):
    """SFT's optimizer: a higher peak, a short warm-up and no weight decay by default.

    The same fields as [optimizer], with their own defaults: nothing is inherited from
    [optimizer] (a recipe's optimizer.beta2, say, leaves SFT at the default here); every value
    SFT should use is set under [sft.optimizer]."""

    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0, description="AdamW decay (never on norms and biases)")


class PrecisionSection(Section):
    """Number formats of training, pretraining and SFT alike (hanlm.train.precision)."""

    mode: Literal["fp32", "bf16", "fp8", "fp8-emulate", "fp4"] = Field(
        "bf16",
        description="number format of training (fp4 is refused)",
        json_schema_extra={"cli": {"flag": "precision"}},
    )
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"


class ParallelSection(Section):
    """How training uses the processes and devices at hand."""

    mode: Literal["auto", "single", "ddp", "fsdp"] = Field(
        "auto",
        description="auto: single process alone, FSDP2 under torchrun",
        json_schema_extra={"cli": {"flag": "parallel"}},
    )
    device: Device = Field("auto", description="auto, cpu or cuda (each rank takes its GPU)")
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none",
        description="pretraining recomputes activations in backward: full keeps each layer's "
        "input only, selective also its matmul and attention outputs (true = full, false = none)",
        json_schema_extra={"cli": {"const": "full"}},  # the flag alone: full
    )
    compile: bool | None = Field(
        None,
        description="torch.compile each decoder block; unset: on with precision fp8 (FP8 is "
        "fast only compiled), off otherwise",
    )
    fsdp_float8_all_gather: bool = Field(False, description="FSDP all-gathers weights in FP8")
    timeout_s: float = Field(
        600,
        gt=0,
        description="a collective waiting this long for a peer (a hung or unreachable host) "
        "fails; a peer whose process is gone is noticed at once",
        json_schema_extra={"cli": {"flag": "collective-timeout", "metavar": "S"}},
    )
    document_attention: Literal["auto", "sdpa", "flex"] = Field(
        "auto",
        description="how packed documents (sft.packing, pretrain.document_masking) are kept "
        "apart: flex attention's block mask, or SDPA with a block-diagonal mask; auto: flex on "
        "CUDA, sdpa elsewhere",
    )
    loss_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="training and validation: the loss makes the logits of this many tokens at "
        "a time, never those of a whole batch",
    )
    loss_kernel: Literal["chunked", "auto", "liger"] = Field(
        "chunked",
        description="how the loss runs: chunked (any device), liger (the fused linear cross "
        "entropy of Liger Kernel: CUDA, when installed), auto (liger where it can, else chunked)",
    )

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_from_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "full" if value else "none"
        return value

    @field_validator("device")
    @classmethod
    def _one_gpu_per_rank(cls, value: str) -> str:
        if value.startswith("cuda:"):
            raise ValueError(
                f"{value!r}: training gives each rank the GPU of its LOCAL_RANK; use cuda "
                "(and CUDA_VISIBLE_DEVICES to choose GPUs)"
            )
        return value


class CheckpointCadence(Section):
    """When a training stage saves: every N steps, every M minutes, and whether it resumes."""

    every: int = Field(
        500,
        ge=0,
        description="steps between checkpoints; 0 = at the end",
        json_schema_extra={"cli": {"flag": "checkpoint-every"}},
    )
    every_minutes: float = Field(
        0,
        ge=0,
        description="also save after this many minutes; 0 = off",
        json_schema_extra={"cli": {"flag": "checkpoint-every-minutes"}},
    )
    resume: Literal["auto", "never"] = Field(
        "auto", description="continue from the latest checkpoint"
    )


class CheckpointSection(CheckpointCadence):
    """Checkpoints of pretraining and SFT: cadence, retention and how they are written
    (SFT's cadence is [sft.checkpoint]; the rest is shared)."""

    async_save: bool = Field(
        True, description="write in the background; the loop blocks only to stage"
    )
    keep_last: int = Field(3, ge=1, description="committed checkpoints kept (newest first)")
    keep_every: int = Field(
        0, ge=0, description="also keep every checkpoint at a multiple of N steps"
    )
    retries: int = Field(3, ge=0, description="retries of a failed write, with exponential backoff")
    backoff_s: float = Field(2.0, ge=0)
    max_consecutive_failures: int = Field(3, ge=1, description="then stop cleanly")
    timeout_s: float = Field(1800, gt=0, description="a write slower than this counts as failed")
    mirror: str | None = Field(None, description="second location: a folder or an fsspec URL")

    # how a checkpoint is written and kept: what the CheckpointManager's Policy takes
    POLICY_KEYS: ClassVar[frozenset[str]] = frozenset(
        {"async_save", "keep_last", "keep_every", "retries", "backoff_s"}
        | {"max_consecutive_failures", "timeout_s", "mirror"}
    )


class SftCheckpointSection(CheckpointCadence):
    """SFT's checkpoint cadence; how checkpoints are written and kept is [checkpoint]'s."""

    every: int = Field(
        100,
        ge=0,
        description="steps between checkpoints; 0 = at the end",
        json_schema_extra={"cli": {"flag": "checkpoint-every"}},
    )


class LoggingCadence(Section):
    """How often a training logs and validates."""

    log_every: int = Field(10, ge=1)
    eval_every: int = Field(100, ge=0, description="validation every N steps; 0 = only at the end")
    eval_batches: int = Field(20, ge=1, description="validation micro-batches per rank")


class WandbSection(Section):
    """Weights & Biases, when [logging] trackers holds "wandb"."""

    project: str = Field(
        "hanlm",
        min_length=1,
        description="W&B project of the runs",
        json_schema_extra={"cli": {"flag": "wandb-project"}},
    )
    entity: str | None = Field(
        None,
        description="W&B team or user the project belongs to; unset: your default entity",
        json_schema_extra={"cli": {"flag": "wandb-entity"}},
    )
    mode: Literal["online", "offline"] = Field(
        "online",
        description="online needs `wandb login` (or WANDB_API_KEY); offline writes the run "
        "under dir only, to upload later with `wandb sync`",
        json_schema_extra={"cli": {"flag": "wandb-mode"}},
    )
    dir: str | None = Field(
        None,
        description="where W&B keeps its files; unset: the stage's folder (RUN/pretrain, RUN/sft)",
        json_schema_extra={"cli": {"flag": False}},
    )


class TrackioSection(Section):
    """trackio (local-first; a Hugging Face Space when asked), when [logging] trackers holds
    "trackio". Locally it writes to TRACKIO_DIR (default ~/.cache/huggingface/trackio)."""

    project: str = Field(
        "hanlm",
        min_length=1,
        description="trackio project of the runs",
        json_schema_extra={"cli": {"flag": "trackio-project"}},
    )
    space_id: str | None = Field(
        None,
        description='log to this Hugging Face Space ("user/name"; needs `hf auth login` or '
        "HF_TOKEN); unset: the local database",
        json_schema_extra={"cli": {"flag": "trackio-space-id"}},
    )


class LoggingSection(LoggingCadence):
    """How often training logs and validates, and the trackers that receive what goes to
    metrics.jsonl (pretraining and SFT alike; SFT's cadence is [sft.logging])."""

    trackers: list[Literal["tensorboard", "trackio", "wandb"]] | None = Field(
        None,
        description="experiment trackers, one or several of tensorboard, trackio, wandb, each "
        "checked before training starts; [] for metrics.jsonl only; unset: TensorBoard when "
        "it is installed",
        json_schema_extra={"cli": {"flag": "tracker"}},
    )
    name: str | None = Field(
        None,
        description="the run's name in the trackers; unset: the run directory's name. "
        "Pretraining logs as NAME-pretrain and SFT as NAME-sft, grouped under NAME",
        json_schema_extra={"cli": {"flag": "tracker-run-name"}},
    )
    wandb: WandbSection = Field(default_factory=WandbSection)
    trackio: TrackioSection = Field(default_factory=TrackioSection)

    # the keys that say when the loop logs, as opposed to where the records go
    CADENCE_KEYS: ClassVar[frozenset[str]] = frozenset(LoggingCadence.model_fields)

    @field_validator("trackers")
    @classmethod
    def _each_once(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"a tracker is named twice in {value}; name each once")
        return value


class SftLoggingSection(LoggingCadence):
    """SFT's cadence; the trackers are [logging]'s."""

    eval_every: int = Field(0, ge=0, description="held-out loss every N steps; 0 = at the end")
    eval_batches: int = Field(8, ge=1, description="held-out micro-batches per rank")


class PretrainSection(Section):
    """`hanlm pretrain`: what only pretraining has: its sequences, batch and length."""

    seq_len: int = Field(512, ge=8, description="tokens per training sequence")
    micro_batch: int = Field(8, ge=1, description="sequences per rank per forward/backward")
    global_batch_tokens: int = Field(
        65536, ge=8, description="tokens per optimizer step over all ranks (sets accumulation)"
    )
    max_steps: int | None = Field(None, ge=1, description="optimizer steps (or use max_tokens)")
    max_tokens: int | None = Field(None, ge=1, description="training tokens, rounded to steps")
    document_masking: bool = Field(
        False,
        description="a window's documents (split at the end-of-document token) do not see "
        "each other: attention stays within a document, positions restart at each",
    )

    def steps(self) -> int | None:
        """Optimizer steps: max_steps, or max_tokens in whole steps; None when neither is set."""
        if self.max_steps is not None:
            return self.max_steps
        if self.max_tokens is not None:
            return max(1, -(-self.max_tokens // self.global_batch_tokens))
        return None

    @model_validator(mode="after")
    def _whole_micro_batches(self) -> PretrainSection:
        per_pass = self.seq_len * self.micro_batch
        if self.global_batch_tokens % per_pass:
            fitting = max(per_pass, round(self.global_batch_tokens / per_pass) * per_pass)
            raise ValueError(
                f"pretrain.global_batch_tokens {self.global_batch_tokens:,} is not a multiple of "
                f"seq_len x micro_batch = {self.seq_len} x {self.micro_batch} = {per_pass:,} "
                f"(e.g. {fitting})"
            )
        return self


# Punctuation and the commonest Korean particles and endings: repeating them is grammar, not a
# loop, so the repetition penalty may spare them (generate.exempt_common_words).
COMMON_KOREAN_WORDS = [
    ".", ",", "!", "?", "'", '"', "(", ")", ":", ";", "·", "…", "-",
    "은", "는", "이", "가", "을", "를", "의", "에", "에서", "에게", "로", "으로", "와", "과",
    "도", "만", "까지", "부터", "보다", "처럼", "이다", "다", "요", "니다", "습니다", "입니다",
    "고", "며", "면", "서", "지만", "는데", "게", "지", "죠", "야",
]  # fmt: skip


class GenerateSection(Section):
    """`hanlm generate` / `hanlm chat` and generation in evals: decoding defaults."""

    max_new_tokens: int = Field(128, ge=1, le=1 << 16, description="new tokens per answer at most")
    min_new_tokens: int = Field(
        0, ge=0, description="end tokens are barred before this many (fixed-length evals)"
    )
    greedy: bool = Field(False, description="always take the likeliest token (no sampling)")
    temperature: float = Field(0.7, gt=0, le=10, description="sampling temperature")
    top_k: int = Field(50, ge=0, description="sample among the k likeliest tokens; 0 = all")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling mass; 1 = off")
    repetition_penalty: float = Field(
        1.1, gt=0, le=10, description="CTRL rule on every token already seen; 1 = off"
    )
    no_repeat_ngram_size: int = Field(0, ge=0, description="forbid repeating any n-gram; 0 = off")
    frequency_penalty: float = Field(
        0.0, ge=-2, le=2, description="subtracted per earlier occurrence in the answer (OpenAI)"
    )
    presence_penalty: float = Field(
        0.0, ge=-2, le=2, description="subtracted once if the token is already in the answer"
    )
    exempt_special_tokens: bool = Field(
        True, description="penalties never touch special tokens (the end-of-turn token stays)"
    )
    exempt_common_words: bool = Field(
        False, description="penalties also spare tokens whose text is in common_words"
    )
    common_words: list[str] = Field(
        default_factory=lambda: list(COMMON_KOREAN_WORDS),
        description="punctuation, particles and endings spared when exempt_common_words is on",
    )
    seed: int = Field(0, description="seed of sampling")
    batch_size: int = Field(8, ge=1, description="prompts decoded together")
    device: Device = Field("auto", description=DEVICE_CHOICES)


class ServeSection(Section):
    """`hanlm serve`: what one request may ask (larger is refused with a 4xx before the engine
    sees it; the message caps are nanochat's web chat's) and how the server stops."""

    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="largest request body in bytes (larger: 413)"
    )
    max_messages: int = Field(500, ge=1, description="messages in one chat request at most")
    max_message_chars: int = Field(8000, ge=1, description="characters in one message at most")
    max_total_chars: int = Field(
        32000, ge=1, description="characters of a request's messages (or prompt) together"
    )
    max_stop: int = Field(4, ge=0, description="stop strings in one request at most (OpenAI's 4)")
    max_stop_chars: int = Field(64, ge=1, description="characters in one stop string at most")
    max_logit_bias: int = Field(300, ge=0, description="logit_bias entries in one request at most")
    body_timeout_s: float = Field(
        30.0, gt=0, description="seconds a client may take to send its body (then 408)"
    )
    shutdown_s: float = Field(
        10.0, ge=0, description="on SIGTERM, seconds answers in flight get to finish"
    )


class DistillSection(Section):
    """Distillation toward a teacher during pretraining or SFT (off by default: measure it first)."""

    enabled: bool = False
    teacher: str | None = Field(
        None, description="Hugging Face model folder with the same tokenizer as the student"
    )
    alpha: float = Field(0.5, ge=0, le=1, description="share of the KL term: (1-a)*CE + a*T^2*KL")
    temperature: float = Field(2.0, gt=0, le=100, description="softmax temperature of both sides")
    teacher_device: Literal["same"] | Device = Field(
        "same", description="`same` (the student's device), cpu, cuda or cuda:N"
    )


class PreflightSection(Section):
    """`hanlm preflight`: measured checks of devices, collectives, storage and data loading."""

    timeout_s: float = Field(
        120,
        gt=0,
        description="rendezvous and collective timeout; a missing peer fails within it",
        json_schema_extra={"cli": {"flag": "timeout", "metavar": "S"}},
    )
    checkpoint_dir: str | None = Field(
        None,
        description="folder to test for checkpoints (default: DIR/pretrain/checkpoints)",
        json_schema_extra={"cli": {"metavar": "DIR"}},
    )
    matmul_seconds: float = Field(0.5, gt=0, description="time spent on each device's matmul test")
    collective_mb: float = Field(64, gt=0, description="payload of each collective test, MB")
    collective_iters: int = Field(5, ge=1, description="timed repetitions of each collective")
    storage_mb: float = Field(256, gt=0, description="bytes written (with fsync) by the disk test")
    fsync_probes: int = Field(10, ge=1, description="small write + fsync pairs timed for latency")
    data_seconds: float = Field(1.0, gt=0, description="time spent reading batches from the shards")
    min_matmul_fraction: float = Field(
        0.3, ge=0, le=1, description="NO-GO when a GPU's matmul reaches less of its catalogue peak"
    )
    max_comm_ratio: float = Field(
        1.0, gt=0, description="NO-GO when communication per step exceeds this times compute"
    )
    min_write_mb_s: float = Field(20, ge=0, description="NO-GO below this write throughput")
    max_fsync_ms: float = Field(2000, gt=0, description="NO-GO above this fsync latency")
    max_save_fraction: float = Field(
        0.5, gt=0, description="NO-GO when a save takes more than this share of its interval"
    )
    min_data_headroom: float = Field(
        2.0, gt=0, description="NO-GO when the loader is less than this many times fast enough"
    )
    fail_on_no_go: bool = Field(
        True,
        description="in the pipeline, stop on NO-GO",
        json_schema_extra={"cli": {"flag": False}},  # only the pipeline reads it: --set
    )


class EvalSection(Section):
    """`hanlm eval`: tasks on the run's model (or given models), scores split by contamination."""

    tasks: list[str] = Field(
        default_factory=lambda: ["demo_qa", "direction"],
        description="NAME or NAME=PATH, repeated or comma-separated (a,b); hanlm's own: "
        "kobest_boolq, kobest_copa, kobest_hellaswag, kobest_sentineg, kobest_wic, gsm8k_ko, "
        "ifeval_ko, direction, demo_qa (PATH: a file, or hf:DATASET[:CONFIG][:SPLIT]); any task "
        "or group of lm-evaluation-harness (kmmlu, haerae, click, kobest, ...; PATH: a folder "
        "holding local copies of their data sets, DIR/REPO as `hf download` writes them)",
        json_schema_extra={"cli": {"flag": "task", "aliases": ["tasks"], "metavar": "NAME[=PATH]"}},
    )
    models: list[str] = Field(
        default_factory=list,
        description="model folders (relative ones inside the run first, e.g. pretrain/hf); "
        "empty = every export of the run: pretrain/hf and sft/hf",
        json_schema_extra={"cli": {"flag": "model", "metavar": "DIR"}},
    )
    contamination: str | None = Field(
        None,
        description="decontam items.jsonl; default: RUN/decontam/items.jsonl when present",
        json_schema_extra={"cli": {"metavar": "PATH"}},
    )
    limit: int | None = Field(None, ge=1, description="first N items of each task")
    batch_size: int = Field(
        32,
        ge=1,
        description="sequences per forward pass",
        json_schema_extra={"cli": {"aliases": ["batch_size"]}},
    )
    dtype: Literal["fp32", "bf16"] = "fp32"
    device: Device = Field("auto", description=DEVICE_CHOICES)
    num_fewshot: int = Field(
        0,
        ge=0,
        le=32,
        description="worked examples in the prompt (gsm8k_ko, lm-eval's tasks; 0: the task's own)",
        json_schema_extra={"cli": {"aliases": ["num_fewshot"]}},
    )
    max_new_tokens: int = Field(256, ge=1, description="generation tasks: token limit")
    distractors: int = Field(
        4, ge=1, description="direction: wrong answers ranked with the right one"
    )
    chat_template: bool = Field(
        False,
        description="wrap the prompt in the tokenizer's chat template (generation tasks, "
        "lm-eval's tasks)",
        json_schema_extra={"cli": {"aliases": ["apply-chat-template", "apply_chat_template"]}},
    )


class DecontamSection(Section):
    """`hanlm decontam`: find benchmark items in the training data and remove them."""

    enabled: bool = Field(
        True,
        description="run the stage between corpus and tokenizer",
        json_schema_extra={"cli": {"flag": False}},  # only the pipeline reads it: --set
    )
    benchmarks: list[str] = Field(
        default_factory=list,
        description="TASK=PATH benchmark files (PATH `demo`: the run's demo world benchmark; an "
        "hf:NAME[:CONFIG]:SPLIT id: that split, read as eval reads it)",
        json_schema_extra={"cli": {"flag": "benchmark", "metavar": "TASK=PATH"}},
    )
    ngram: int = Field(
        27, ge=4, le=512, description="characters per n-gram (no spaces, no punctuation)"
    )
    dirty_threshold: float = Field(0.8, gt=0, le=1, description="coverage at or above: dirty")
    clean_threshold: float = Field(0.2, gt=0, le=1, description="coverage below: clean")
    action: Literal["drop", "cut", "keep"] = Field(
        "drop",
        description="documents holding part of a dirty or partial item: drop them, cut the "
        "matching spans, or keep them (report only)",
    )
    cut_margin: int = Field(50, ge=0, description="cut: characters also removed on each side")
    action_sources: list[str] = Field(
        default_factory=list,
        description="the corpus sources the action applies to (e.g. drop leaks from wiki, "
        "leave web untouched), and with action keep the sources whose leaks compare_drop's run "
        "drops (what that source's leaks add to each score); empty: every source. The report "
        "counts every source either way",
        json_schema_extra={"cli": {"flag": "action-source", "metavar": "SOURCE"}},
    )
    compare_drop: bool = Field(
        False,
        description="with action keep: also train and evaluate the same recipe on the corpus "
        "with the flagged documents dropped (RUN/compare/drop/), to show scores before and "
        "after decontamination side by side; costs a second pretraining",
        json_schema_extra=_NO_FLAG,
    )
    text_field: str = Field("text", min_length=1, description="JSONL field with the text")
    max_documents: int = Field(5, ge=0, description="document ids listed per item in items.jsonl")
    # how many scan tasks run at once is data_engine.workers
    batch_bytes: int = Field(
        4_000_000, ge=1000, description="bytes of text a scan task reads and looks up at once"
    )


LORA_TARGETS_DEFAULT = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class SftLoraSection(Section):
    """LoRA's settings (sft.method = "lora"), PEFT's LoraConfig by other names: adapters of
    rank `rank` scaled by alpha / rank on the named linear layers of every block."""

    rank: int = Field(
        16,
        ge=1,
        description="the adapters' rank r",
        json_schema_extra={"cli": {"flag": "lora-rank"}},
    )
    alpha: float = Field(
        32.0,
        gt=0,
        description="scale alpha: updates are scaled by alpha / rank",
        json_schema_extra={"cli": {"flag": "lora-alpha"}},
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout on the adapters' input",
        json_schema_extra={"cli": {"flag": "lora-dropout"}},
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS_DEFAULT),
        min_length=1,
        description="the linear layers that get adapters, by name (Llama's attention and MLP)",
        json_schema_extra={"cli": {"flag": "lora-target-modules", "metavar": "NAME,..."}},
    )


Init = Literal["mean", "mean-cov", "text", "none"]


class SftVariant(Section):
    """One variant of an SFT in sft.compare: the settings it changes (unset: the SFT's own)."""

    init: Init | None = None
    method: Literal["full", "lora"] | None = None
    train_new_token_rows: bool | None = None

    def resolved(self, sft: SftSection) -> SftVariant:
        return SftVariant(
            init=self.init or sft.init,
            method=self.method or sft.method,
            train_new_token_rows=(
                sft.train_new_token_rows
                if self.train_new_token_rows is None
                else self.train_new_token_rows
            ),
        )

    @property
    def name(self) -> str:
        """full-mean, lora-none-frozen, lora-mean-rows: the folder and the key of its closure
        (full fine-tuning trains every row: its name says nothing about them)."""
        if self.method == "full":
            return f"full-{self.init}"
        return f"lora-{self.init}-{'rows' if self.train_new_token_rows else 'frozen'}"

    @property
    def rows_stay_untrained(self) -> bool:
        """LoRA with the template rows frozen and not initialised: the field's setup, whose
        answers never end."""
        return self.method == "lora" and not self.train_new_token_rows and self.init == "none"


CHAT_FORMATS = ("messages", "sharegpt", "alpaca")


class SftSourceSection(Section):
    """One `[[sft.sources]]` table: a named set of chat data, its shape and its share."""

    name: SourceName = Field(description="the source's name in the SFT data report")
    inputs: list[str] = Field(
        min_length=1,
        description="globs of .jsonl/.json/.parquet files (optionally .gz/.zst) or "
        "hf:NAME[@REVISION][:CONFIG]:SPLIT ids, as corpus inputs",
    )
    weight: float | None = Field(
        None,
        gt=0,
        le=1,
        description="share of the training conversations (the weights sum to 1); unset on "
        "every source: each conversation once",
    )
    max_epochs: float = Field(
        EPOCHS_WARNING,
        gt=0,
        le=1000,
        description="how often its conversations may repeat to reach its share; more is an "
        "error before training",
    )
    format: Literal["auto", "messages", "sharegpt", "alpaca"] = Field(
        "auto",
        description='"messages" ({"messages": [{"role", "content"}]}), "sharegpt" '
        '({"conversations": [{"from", "value"}]}), "alpaca" (instruction, input, output), or '
        '"auto": told from the first row, and said',
    )
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="the format's keys named as this source names them, e.g. "
        '{ conversations = "dialog", from = "speaker" } (messages: messages, role, content; '
        "sharegpt: conversations, from, value, system; alpaca: instruction, input, output, "
        "system; any: id)",
    )


class SftSection(Section):
    """`hanlm sft`: chat fine-tuning with the special-token audit, initialisation and closure check.

    It shares [precision] and [parallel] with pretraining and [checkpoint]'s policy; its
    optimizer, checkpoint cadence and logging are its own, in [sft.optimizer],
    [sft.checkpoint] and [sft.logging] ([optimizer]'s values are not inherited).
    """

    model: str | None = Field(
        None,
        description="HF folder to fine-tune instead of the run's pretraining checkpoint",
        json_schema_extra={"cli": {"metavar": "HF_DIR"}},
    )
    data: str | None = Field(
        None,
        description="one chat data source (a file, glob or hf: id, its format told from its "
        "first row): the shorthand for one [[sft.sources]]; default: the run's demo world "
        "DIR/demo/chat.jsonl",
    )
    sources: list[SftSourceSection] = Field(
        default_factory=list,
        description="[[sft.sources]] tables: chat data in several sets, shapes and shares",
        json_schema_extra=_NO_FLAG,
    )
    strict: bool = Field(
        False,
        description="the first chat row that cannot be read is an error (else rows are "
        "skipped, counted by reason with examples in the SFT data report)",
    )
    seq_len: int = Field(256, ge=16, description="tokens per training row; longer chats dropped")
    micro_batch: int = Field(8, ge=1, description="rows per rank per forward/backward")
    batch_rows: int = Field(8, ge=1, description="rows per optimizer step over all ranks")
    packing: bool = Field(True, description="pack whole conversations into rows (else pad)")
    max_steps: int = Field(200, ge=1, description="optimizer steps")
    heldout: int = Field(50, ge=1, description="conversations held out for the closure check")
    init: Init = Field(
        "mean", description="initialisation of the template tokens the audit finds untrained"
    )
    init_text: str = Field(".", min_length=1, description="init = text: mean of its tokens' rows")
    new_token_lr_scale: float = Field(
        1.0,
        gt=0,
        description="full fine-tuning: the initialised rows' update size relative to the "
        "schedule (LoRA's trained rows follow the schedule)",
    )
    closure_max_tokens: int = Field(64, ge=1, description="greedy tokens per closure prompt")
    min_closure: float = Field(0.0, ge=0, le=1, description="fail below this rate; 0 = off")
    method: Literal["full", "lora"] = Field(
        "full",
        description="full: every weight trains; lora: PEFT's LoRA adapters on sft.lora."
        "target_modules, the rest frozen, merged into the export",
    )
    lora: SftLoraSection = Field(default_factory=SftLoraSection)
    train_new_token_rows: bool = Field(
        True,
        description="lora: also train the chat template tokens' embedding rows (only those "
        "rows: PEFT's trainable_token_indices); false freezes them, the field's failing setup",
    )
    compare: list[SftVariant] = Field(
        default_factory=list,
        description="also train these variants of this SFT (ablation/<name>/), e.g. "
        '[{init = "none", method = "lora", train_new_token_rows = false}]',
        json_schema_extra={"cli": {"flag": False}},  # --set sft.compare=[{...}, ...]
    )
    contaminated: Literal["drop", "fail"] = Field(
        "drop", description="conversations holding benchmark items: drop them or fail"
    )
    contamination_coverage: float = Field(
        0.5, gt=0, le=1, description="share of an item a conversation must hold to count"
    )
    optimizer: SftOptimizerSection = Field(default_factory=SftOptimizerSection)
    checkpoint: SftCheckpointSection = Field(default_factory=SftCheckpointSection)
    logging: SftLoggingSection = Field(default_factory=SftLoggingSection)

    @model_validator(mode="after")
    def _one_data_layout(self) -> SftSection:
        if self.sources and self.data:
            raise ValueError(
                "sft.data and [[sft.sources]] are both set: sft.data is the one-source "
                "shorthand; list it among the sources, or drop the sources"
            )
        _names_once("[[sft.sources]]", self.sources)
        weighted = [s.weight is not None for s in self.sources]
        if any(weighted) and not all(weighted):
            bare = ", ".join(s.name for s in self.sources if s.weight is None)
            raise ValueError(
                f"sft source(s) {bare} have no weight while others do: give every source a "
                "weight, or none (each conversation once)"
            )
        weights = [s.weight for s in self.sources if s.weight is not None]
        if weights and abs(sum(weights) - 1.0) > WEIGHT_TOLERANCE:
            raise ValueError(f"the sft source weights sum to {sum(weights):.4g}, not 1")
        return self

    def source_list(self) -> list[SftSourceSection]:
        """The sources; `data` as one source named "chat"; [] for the demo world's chats."""
        if self.sources:
            return list(self.sources)
        return [SftSourceSection(name="chat", inputs=[self.data])] if self.data else []

    @model_validator(mode="after")
    def _whole_micro_batches(self) -> SftSection:
        if self.batch_rows % self.micro_batch:
            raise ValueError(
                f"sft.batch_rows {self.batch_rows} is not a multiple of sft.micro_batch "
                f"{self.micro_batch}"
            )
        return self

    def variant(self) -> SftVariant:
        """This SFT's own variant (its name keys its closure beside the compared ones)."""
        return SftVariant(
            init=self.init, method=self.method, train_new_token_rows=self.train_new_token_rows
        ).resolved(self)

    def variants(self) -> list[SftVariant]:
        """This SFT's variant, then each compared one not equal to an earlier one."""
        seen: dict[str, SftVariant] = {}
        for variant in [self.variant(), *(v.resolved(self) for v in self.compare)]:
            seen.setdefault(variant.name, variant)
        return list(seen.values())


class LaunchSection(Section):
    """`hanlm launch`: the recipe onto rented GPUs (SkyPilot) or a cluster (Slurm). The hardware
    is the plan's (plan.gpu, plan.gpus per host, plan.hosts); the cost assumptions are stated
    here so that the launch prints and keeps them."""

    engine: Literal["skypilot", "slurm"] = Field(
        "skypilot",
        description="what starts the hosts: SkyPilot (clouds, RunPod, Vast.ai, "
        "Lambda, Kubernetes) or Slurm (sbatch + srun)",
    )
    spot: bool = Field(
        False, description="spot (preemptible) hosts: cheaper, and a preempted run is resumed"
    )
    accelerator: str | None = Field(
        None,
        description="SkyPilot's accelerator name (default: plan.gpu's, e.g. RTX5090, H100)",
        json_schema_extra={"cli": {"metavar": "NAME"}},
    )
    infra: str | None = Field(
        None,
        description="SkyPilot infra to run on, e.g. runpod, vast, lambda, aws/us-east-1, k8s "
        "(default: the cheapest SkyPilot finds)",
        json_schema_extra={"cli": {"metavar": "INFRA"}},
    )
    bucket: str | None = Field(
        None,
        description="bucket that holds the run folder on the hosts and outlives them "
        "(s3://NAME, gs://NAME, r2://NAME or a name); needed for several hosts, for spot "
        "hosts advised",
        json_schema_extra={"cli": {"metavar": "URL"}},
    )
    disk_gb: int | None = Field(
        None,
        ge=10,
        description="each host's disk, GB (default: the corpus, shards and "
        "checkpoints the plan expects, doubled, at least 100)",
    )
    install: str | None = Field(
        None,
        description="pip requirement that installs hanlm on the hosts (default: "
        "hanlm[EXTRAS]==this version, the extras the recipe needs)",
        json_schema_extra={"cli": {"metavar": "REQUIREMENT"}},
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="hosts tried again after a NO-GO preflight or a crash (a preempted run is "
        "always resumed)",
    )
    until: str = Field(
        "report",
        description="the last stage the hosts run, e.g. pretrain to train there and evaluate "
        "elsewhere",
        json_schema_extra={"cli": {"flag": "launch-until", "metavar": "STAGE"}},
    )
    master_port: int = Field(29500, ge=1024, le=65535, description="torchrun's port on host 0")
    rejected_host_share: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="assumed share of rented hosts preflight rejects (the field report: 3 of 4)",
    )
    minutes_per_rejected_host: float = Field(
        15,
        ge=0,
        description="assumed minutes a rejected host is paid for: start, install, preflight",
    )
    preemptions_per_day: float = Field(
        2.0, ge=0, description="assumed preemptions per day of a spot run (on-demand: none)"
    )
    minutes_per_restart: float = Field(
        15,
        ge=0,
        description="assumed minutes a preemption costs besides the lost steps: a "
        "new host, install, resume",
    )
    partition: str | None = Field(
        None, description="Slurm partition", json_schema_extra={"cli": {"metavar": "NAME"}}
    )
    time_limit_hours: float | None = Field(
        None,
        gt=0,
        description="Slurm time limit of one allocation (default: the plan's wall time and a "
        "quarter, at least 1 h); the job requeues itself when it is reached",
    )
    signal_seconds: int = Field(
        300,
        ge=30,
        description="Slurm: seconds before the time limit that the job is told to save and stop",
    )


class PlanSection(Section):
    """`hanlm plan`: the hardware and budget to plan the recipe's pretraining for."""

    gpu: str | None = Field(
        None,
        description="catalogue GPU (rtx4090, rtx5090, l40s, a100-40gb, a100-80gb, h100, "
        "h200, b200), `cpu`, or unset to compare them all",
    )
    gpus: int = Field(1, ge=1, le=4096, description="GPUs per host")
    hosts: int = Field(1, ge=1, le=1024)
    tokens: float | None = Field(
        None, gt=0, description="training tokens (default: the pretrain section's length)"
    )
    price_per_gpu_hour: float | None = Field(
        None, ge=0, description="USD per GPU-hour", json_schema_extra={"cli": {"metavar": "USD"}}
    )
    mfu: float | None = Field(
        None,
        gt=0,
        le=1,
        description="model FLOPs utilisation of the plan and of preflight's projected step time "
        "(default: typical per GPU class)",
    )
    inter_host_gbps: float = Field(25.0, gt=0, description="network between hosts, Gbit/s")
    corpus_gb: float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="raw text the data stages read, GB of UTF-8; 0 = from the local input files, "
        "else from the token target (hf: inputs, demo)",
        json_schema_extra={"cli": {"metavar": "GB"}},
    )
    data_cores: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="CPU cores the data stages (corpus, decontam, shards) run on; 0 = "
        "data_engine.workers on a local engine, else this machine's cores",
        json_schema_extra={"cli": {"metavar": "N"}},
    )


_HUB_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def _hub_license(value: str) -> str:
    if not _HUB_LICENSE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Hub license id: write one of "
            "huggingface.co/docs/hub/repositories-licenses in lower case, e.g. apache-2.0, mit, "
            "cc-by-4.0, or `other`"
        )
    return value


class PublishSection(Section):
    """`hanlm publish`: the model card's license and the Hub repository's visibility."""

    license: Annotated[str, AfterValidator(_hub_license)] = Field(
        "apache-2.0",
        description="the model's license on the card, a Hub license id (apache-2.0, mit, "
        "cc-by-4.0, other...); check that the training data's licenses allow it",
    )
    private: bool = Field(False, description="create the Hub repository private")


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
        if self.sft.optimizer.name == "muon" and self.sft.method == "lora":
            raise ValueError(
                'sft.optimizer.name = "muon" with sft.method = "lora": LoRA\'s adapters are '
                "low-rank factors, not the matrices Muon orthogonalises (compared LoRA variants "
                'train with AdamW); use sft.optimizer.name = "adamw", or sft.method = "full"'
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
    if os.environ.get("RANK", "0") != "0":  # under torchrun, say it once
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
