"""Where the report card finds what each stage wrote (the report stage fills it in from the run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFiles:
    """Every file the report reads and the folder its figures go to; a missing file is a
    stage that has not run."""

    name: str  # the report's title
    root: Path  # figure links are written relative to it
    plots: Path
    config: Path  # the run's config.toml: the decoding penalties of the repetition task
    plan: Path
    preflight: Path
    corpus_stats: Path
    decontam_report: Path
    decontam_items: Path
    planted: Path  # the demo world's planted benchmark items
    pretrain_metrics: Path
    pretrain_summary: Path
    sft_metrics: Path
    closure: Path
    sft_summary: Path  # every variant's closure rate
    ablation_closure: Callable[[str], Path]  # variant -> the closure.json of that compared SFT
    audit: Path
    eval_results: Path
    eval_samples: Path
    export_folder: str  # what a training stage names its Hugging Face export (".../pretrain/hf")
    # the samples.jsonl of the same recipe trained without the flagged documents (compare stage)
    compare_eval_samples: Path | None = None
    launch: Path | None = None  # `hanlm launch`'s launch.json, when the run was launched
    rehearsal: Path | None = None  # `hanlm rehearse`'s rehearsal.json, when one was made
