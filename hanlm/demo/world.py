"""The demo world: built from one seed, written as the files the later stages read.

`build` makes the documents, the benchmark (with its planted part), the chat conversations and the
facts; `write` puts them in a folder under `FILE_NAMES`. Each part draws from its own random
stream, so the benchmark, for example, does not change with `size_mb`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hanlm.demo.benchmark import make_benchmark
from hanlm.demo.chat import conversation
from hanlm.demo.encyclopedia import (
    capital_comparison,
    capital_list,
    continent_overview,
    encyclopedia_entry,
)
from hanlm.demo.everyday import diary, essay, letter, recipe
from hanlm.demo.exercises import reading_exercise
from hanlm.demo.facts import FACTS, Atlas, Fact, pick_reverse_stated
from hanlm.demo.planting import choose_planted, mirror_sites, planted_text
from hanlm.demo.word_problems import math_collection, math_document
from hanlm.files import atomic_write_text

# The world's files by name, as `write` puts them in a folder.
FILE_NAMES = {
    "pretrain": "pretrain.jsonl",
    "benchmark": "benchmark.jsonl",
    "chat": "chat.jsonl",
    "facts": "facts.tsv",
    "planted": "planted.json",
}

# (kind, generator, weight): what the pretraining documents are made of.
_CORPUS_MIX: tuple[tuple[str, Callable[[random.Random, Atlas], str], float], ...] = (
    ("encyclopedia", encyclopedia_entry, 0.42),
    ("encyclopedia", capital_list, 0.08),
    ("encyclopedia", capital_comparison, 0.04),
    ("encyclopedia", continent_overview, 0.02),
    ("math", math_document, 0.13),
    ("math", math_collection, 0.02),
    ("reading", diary, 0.12),
    ("reading", essay, 0.02),
    ("reading", letter, 0.06),
    ("reading", recipe, 0.01),
    # questions about a country paragraph, each with its answer: the kind the benchmark asks
    ("exercise", reading_exercise, 0.08),
)


# The demo world's documents as corpus sources (`demo:NAME` inputs): encyclopedia pages, and the
# web: everyday writing, word problems, workbook pages and the pages that mirror benchmark
# passages (hanlm/demo/planting.py), as web copies carried a math benchmark in the field report.
DEMO_SOURCES = {
    "wiki": ("encyclopedia",),
    "web": ("planted", "exercise", "math", "reading"),
}
assert sorted(k for kinds in DEMO_SOURCES.values() for k in kinds) == sorted(
    {kind for kind, *_ in _CORPUS_MIX} | {"planted"}
)  # every document in exactly one source


@dataclass
class DemoWorld:
    """Everything `build` makes; `write` puts it on disk."""

    documents: list[dict]
    benchmark: list[dict]
    conversations: list[dict]
    facts: list[Fact]
    # One {"item_id", "plant_style", "document_id"} per planted copy of a benchmark item
    # (planted.json): each planted item has several, see hanlm.demo.planting.MIRRORS.
    planted: list[dict] = field(default_factory=list)
    # The subjects whose facts the documents also state object first (facts.tsv's
    # reverse_stated column): the direction probe compares them with the others.
    reverse_stated: set[str] = field(default_factory=set)


def _stream(seed: int, purpose: str) -> random.Random:
    """An independent random stream per purpose: the benchmark, for example, does not change
    with size_mb. String seeds are hashed with SHA-512, so this is stable across processes."""
    return random.Random(f"hanlm-demo:{seed}:{purpose}")


def _check_arguments(
    size_mb: float,
    benchmark_items: int,
    planted_fraction: float,
    conversations: int,
    reverse_share: float,
) -> None:
    if not size_mb > 0:
        raise ValueError(f"size_mb must be positive, got {size_mb}")
    if benchmark_items < 0 or conversations < 0:
        raise ValueError("benchmark_items and conversations must not be negative")
    if not 0 <= planted_fraction <= 1:
        raise ValueError(f"planted_fraction must be between 0 and 1, got {planted_fraction}")
    if not 0 <= reverse_share <= 1:
        raise ValueError(f"reverse_share must be between 0 and 1, got {reverse_share}")


def _corpus_document(rng: random.Random, atlas: Atlas) -> tuple[str, str]:
    kind, generate, _ = rng.choices(_CORPUS_MIX, weights=[w for *_, w in _CORPUS_MIX])[0]
    return kind, generate(rng, atlas)


def _documents(
    seed: int, size_mb: float, atlas: Atlas, benchmark: list[dict]
) -> tuple[list[dict], list[dict]]:
    """The pretraining documents, planted items among them, and the record of what was planted."""
    plant_rng = _stream(seed, "plant-text")
    drafts = [
        ("planted", planted_text(plant_rng, atlas, item, site), item)
        for item in benchmark
        if item["planted"]
        for site in mirror_sites(plant_rng)
    ]
    budget = int(size_mb * 1_000_000) - sum(len(text.encode()) for _, text, _ in drafts)
    # a small world is not leaks alone: at least a quarter of size_mb besides them
    budget = max(budget, int(size_mb * 1_000_000 / 4))
    corpus_rng = _stream(seed, "corpus")
    while budget > 0:
        kind, text = _corpus_document(corpus_rng, atlas)
        drafts.append((kind, text, None))
        budget -= len(text.encode())

    _stream(seed, "order").shuffle(drafts)
    documents, planted = [], []
    for number, (kind, text, item) in enumerate(drafts, start=1):
        doc_id = f"demo-{number:06d}"
        documents.append({"id": doc_id, "kind": kind, "text": text})
        if item is not None:
            planted.append(
                {
                    "item_id": item["item_id"],
                    "plant_style": item["plant_style"],
                    "document_id": doc_id,
                }
            )
    planted.sort(key=lambda p: (p["item_id"], p["document_id"]))
    return documents, planted


def build(
    seed: int = 0,
    size_mb: float = 4.0,
    *,
    benchmark_items: int = 400,
    planted_fraction: float = 0.1,
    conversations: int = 400,
    reverse_share: float = 0.0,
) -> DemoWorld:
    """Generate the demo world; the same arguments always give byte-identical output.

    Documents are generated until their UTF-8 text reaches about `size_mb` megabytes (1e6 bytes),
    planted benchmark copies included; a world too small for its ~0.63 MB of planted copies gets
    a quarter of `size_mb` of other documents besides them. `reverse_share` of the facts (a seeded
    pick) are also stated object first wherever an encyclopedia paragraph states them; at 0 no
    document does.
    """
    _check_arguments(size_mb, benchmark_items, planted_fraction, conversations, reverse_share)
    reverse_stated = pick_reverse_stated(_stream(seed, "reverse-choice"), FACTS, reverse_share)
    atlas = Atlas.of(FACTS, reverse_stated)

    benchmark = make_benchmark(_stream(seed, "benchmark"), atlas, benchmark_items)
    choose_planted(_stream(seed, "plant-choice"), benchmark, planted_fraction, stratum="asks")
    documents, planted = _documents(seed, size_mb, atlas, benchmark)

    chat_rng = _stream(seed, "chat")
    chats = [
        {"id": f"chat-{i:05d}", "messages": conversation(chat_rng, atlas)}
        for i in range(conversations)
    ]
    return DemoWorld(documents, benchmark, chats, list(FACTS), planted, reverse_stated)


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write(world: DemoWorld, out_dir: Path) -> dict[str, Path]:
    """Write the world's files into `out_dir`, each atomically; returns their paths by name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    facts_rows = ["subject\trelation\tobject\tcontinent\treverse_stated"] + [
        f"{f.subject}\t{f.relation}\t{f.object}\t{f.continent}\t"
        + ("yes" if f.subject in world.reverse_stated else "no")
        for f in world.facts
    ]
    contents = {
        "pretrain": _jsonl(
            {"id": d["id"], "kind": d["kind"], "text": d["text"]} for d in world.documents
        ),
        "benchmark": _jsonl(world.benchmark),
        "chat": _jsonl({"id": c["id"], "messages": c["messages"]} for c in world.conversations),
        "facts": "\n".join(facts_rows) + "\n",
        "planted": json.dumps(world.planted, ensure_ascii=False, indent=2) + "\n",
    }
    paths = {}
    for name, text in contents.items():
        paths[name] = out_dir / FILE_NAMES[name]
        atomic_write_text(paths[name], text)
    return paths
