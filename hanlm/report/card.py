"""`hanlm report`: the report card, a markdown text with its figures in a plots folder.

Every section sets one lesson of the field report (a 1.35B Korean model pretrained for ~240 USD
on 4-8 RTX 5090s) beside what this run measured. The report only reads what the stages wrote;
a stage that did not run is named as missing, never filled in. The report stage
(hanlm.stages.report) tells it where each file is (`RunFiles`).
"""

from __future__ import annotations

import time

from hanlm.report.closure_section import closure_section
from hanlm.report.contamination_section import FIELD_BOOLQ, contamination_section
from hanlm.report.data_section import data_section, training_section
from hanlm.report.direction_section import (
    FIELD_DIRECTION,
    direction_section,
    distillation_section,
    repetition_section,
)
from hanlm.report.markdown import heading
from hanlm.report.plan_section import plan_section, preflight_section
from hanlm.report.run_files import RunFiles

# The field report's own figures, quoted beside ours.
FIELD_CLOSURE = {"none": (0, 50), "mean": (49, 50)}

SECTIONS = (  # (title, the field report's lesson, the body measured in this run)
    (
        "1. Plan: will it fit, what will it cost",
        "a 1.35B model with its AdamW states needs more than 25 GB: one "
        "RTX 5090 (32 GB) cannot train it; 8 of them trained ~22B tokens in about 590 GPU-hours, "
        "~240 USD at 0.40 USD per GPU-hour.",
        plan_section,
    ),
    (
        "2. Preflight: GO or NO-GO before the money is spent",
        "on a GPU marketplace, 3 of 4 non-datacenter hosts could not even "
        "start training because of their network.",
        preflight_section,
    ),
    (
        "3. Corpus and contamination",
        f"Wikipedia-heavy pretraining data overlapped the benchmarks: "
        f"{FIELD_BOOLQ[0]:,} of KoBEST BoolQ's {FIELD_BOOLQ[1]:,} test questions substantially "
        f"matched training data ({FIELD_BOOLQ[0] / FIELD_BOOLQ[1]:.0%}).",
        data_section,
    ),
    (
        "4. Pretraining: loss, throughput and MFU",
        "FP8 was the realistic precision on RTX 5090s; FP4 looked faster in "
        "isolation but was slower end to end. hanlm trains in bf16 or FP8 and refuses FP4.",
        training_section,
    ),
    (
        "5. Clean versus contaminated scores",
        "the model's KoBEST lead over gemma-3-1b came from contaminated "
        "items; once they were removed the lead vanished.",
        contamination_section,
    ),
    (
        "6. Chat answers that end: closure rate by initialisation and fine-tuning",
        f"pretraining never saw the chat template's special tokens and their "
        f"embeddings were never initialised: after SFT the model closed "
        f"{FIELD_CLOSURE['none'][0]} of {FIELD_CLOSURE['none'][1]} answers; with those vectors "
        f"initialised separately, {FIELD_CLOSURE['mean'][0]} of {FIELD_CLOSURE['mean'][1]}.",
        closure_section,
    ),
    (
        "7. Knowledge in both directions",
        f'"A\'s capital is B" was learned, "B is the capital of which '
        f'country" much less: mean log-prob of the right answer {FIELD_DIRECTION["forward"]} '
        f"forward, {FIELD_DIRECTION['reverse']} reverse.",
        direction_section,
    ),
    (
        "8. Repetition with and without the decoding penalty",
        "long generations fell into repeating words; data changes did not "
        "cure it, a decoding-time repetition penalty did.",
        repetition_section,
    ),
)


# --- the whole card -----------------------------------------------------------------------------


def build(files: RunFiles) -> str:
    """The report card's markdown; its figures are written into `files.plots`."""
    parts = [
        f"# hanlm report card: {files.name}\n\n",
        "Each section sets a lesson of the field report (a 1.35B Korean model pretrained from "
        "scratch on ~22B tokens for about 240 USD on 4-8 RTX 5090s) beside what this run "
        f"measured. Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n",
        *(heading(title, lesson) + section(files) for title, lesson, section in SECTIONS),
        distillation_section(),
    ]
    return "\n".join(parts)
