"""The data sections: [demo], [corpus] (its quality checks and sources), [data_engine],
[decontam], [tokenizer] and [shards]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, model_validator

from hanlm.config.base import (
    _NO_FLAG,
    EPOCHS_WARNING,
    WEIGHT_TOLERANCE,
    Section,
    SourceName,
    _names_once,
)


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


def _read_amount(value: Any) -> str | int:
    if value in ("needed", "all") or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 1
    ):
        return value
    raise ValueError(
        f'read must be "needed", "all" or a whole number of training tokens >= 1, not {value!r}'
    )


ReadAmount = Annotated[str | int, PlainValidator(_read_amount)]


DEFAULT_SOURCE = "corpus"  # the one source that a flat corpus.inputs list is


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
