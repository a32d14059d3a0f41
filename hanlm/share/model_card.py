"""The model card of a published run: Hub metadata (YAML) and a markdown body, built only from
what the run's stages wrote.

The metadata follows the Hub's model card spec: `language`, `license`, `datasets` (the `hf:`
inputs the model was trained on), `library_name`, `pipeline_tag`, `tags`, and a `model-index`
holding every score of the published model in eval/results.json. A benchmark is one model-index
result (task + dataset); its full / clean / dirty scores are separate metrics of that result,
told apart by the metric's `config` (the split of the items, e.g. `clean`) and named
`acc (clean, n=118)`, with `args: {n, stderr}`. The dataset's `args` carry decontam's summary of
that benchmark (items checked, dirty, partial, found whole, found only by parts). This is the
layout huggingface_hub's own parser (`ModelCardData`, `model_index_to_eval_results`) reads back
score by score: splits as dataset splits would be merged into one result by the parser's
(task, dataset, config, split) grouping only if they shared them, and would claim splits the
benchmark does not have.

A part of the card whose data the run lacks (no decontam, no plan, no report) says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hanlm.data import dataset_repo
from hanlm.errors import UserError

if TYPE_CHECKING:  # the result types, for annotations only: the card reads their attributes
    from hanlm.config import Config
    from hanlm.data.decontam.outputs import DecontamReport
    from hanlm.evals.results import TaskRecord, TaskScores
    from hanlm.plan.estimate import Plan
    from hanlm.preflight.report import PreflightReport
    from hanlm.train.results import MetricsRecord, PretrainSummary, SftSummary

TASK_TYPE = "text-generation"  # every hanlm task scores a causal LM's log-likelihoods or text
TASK_NAME = "Text Generation"
TAGS = ("hanlm", "korean", "from-scratch")
SPLIT_ORDER = ("full", "clean", "dirty", "partial")  # others follow in their own order
LESSONS_FILE = "report.md"  # what the report stage calls its card (for the missing-part notes)


@dataclass(frozen=True)
class CardFacts:
    """What the card is built from: the run's files, already read (None: the stage did not run
    or wrote no such file)."""

    repo_id: str
    kind: str  # "chat" or "base"
    license: str
    model_config: dict  # the export's config.json
    parameters: int | None  # counted in the export's weights
    scores: dict[str, TaskScores]  # results.json's results[model]: task -> split -> metric
    tasks: dict[str, TaskRecord]  # results.json's tasks
    hub_sources: dict = field(default_factory=dict)  # task -> (dataset, config, None) it copies
    split_note: str | None = None  # results.json's contamination_splits
    datasets: list[str] = field(default_factory=list)  # Hub dataset ids trained on
    corpus_inputs: list[str] = field(default_factory=list)
    recipe: Config | None = None  # the run's resolved configuration
    decontam: DecontamReport | None = None
    plan: Plan | None = None
    preflight: PreflightReport | None = None
    pretrain_summary: PretrainSummary | None = None
    pretrain_metrics: list[MetricsRecord] = field(default_factory=list)
    sft_summary: SftSummary | None = None
    report: str | None = None  # report.md
    plots: list[str] = field(default_factory=list)  # repo paths of the report's figures
    gguf: str | None = None  # the GGUF file's name in the repository


# --- metadata ------------------------------------------------------------------------------


def hf_dataset(source) -> tuple[str, str | None, str | None] | None:
    """(dataset id, config, split) of a source: an `hf:NAME[@REVISION][:CONFIG]:SPLIT` id, or
    already such a triple (a local file's Hub original, its split unclaimed); else None."""
    if isinstance(source, (tuple, list)):
        return tuple(source) if source and source[0] else None
    if not source or not dataset_repo.is_hf_id(str(source)):
        return None
    try:
        name, config, split = dataset_repo.parse_hf(str(source))
    except UserError:  # a bare hf:NAME (what a card cites for a corpus): the dataset alone
        name, config, split = str(source).removeprefix("hf:"), None, None
    repo = dataset_repo.hub_name_and_revision(name)[0]
    return (repo, config, split) if repo and ":" not in repo else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ordered_splits(splits) -> list[str]:
    known = [split for split in SPLIT_ORDER if split in splits]
    return known + [split for split in splits if split not in SPLIT_ORDER]


def _contamination_args(facts: CardFacts, task: str) -> dict | None:
    record = facts.tasks.get(task)
    if record is None or facts.decontam is None:
        return None
    summary = facts.decontam.benchmarks.get(record.benchmark or "")
    if summary is None:
        return None
    return {f"decontam_{key}": value for key, value in summary.model_dump().items()}


def eval_results(facts: CardFacts):
    """Every finite score of the published model as huggingface_hub EvalResults (see the module
    docstring for the layout). Scores without a value (a split with no items) are left out: the
    Hub's format has no empty metric; the card's table shows them as `-`."""
    from huggingface_hub import EvalResult  # deferred: ~0.3 s, only when a card is built

    results = []
    taken: dict[tuple, str] = {}  # (dataset, config, split) -> task: the parser's grouping key
    for task, splits in facts.scores.items():
        record = facts.tasks.get(task)
        source = hf_dataset(record.source if record else None) or hf_dataset(
            facts.hub_sources.get(task)
        )
        dataset, config, split = source or (task, None, None)
        if taken.setdefault((dataset, config, split), task) != task:
            dataset, config, split = task, None, None  # two tasks on one dataset: keep them apart
        dataset_args = _contamination_args(facts, task)
        for split_name in ordered_splits(splits):
            for metric, score in (splits[split_name] or {}).items():
                if not _finite(score.value):
                    continue
                args = {"n": score.n}
                if _finite(score.stderr):
                    args["stderr"] = score.stderr
                results.append(
                    EvalResult(
                        task_type=TASK_TYPE,
                        task_name=TASK_NAME,
                        dataset_type=dataset,
                        dataset_name=task,
                        dataset_config=config,
                        dataset_split=split,
                        dataset_args=dataset_args,
                        metric_type=metric,
                        metric_value=float(score.value),
                        metric_name=f"{metric} ({split_name}, n={score.n})",
                        metric_config=split_name,
                        metric_args=args,
                    )
                )
    return results


def card_data(facts: CardFacts):
    """The card's YAML metadata as huggingface_hub's ModelCardData."""
    from huggingface_hub import ModelCardData  # deferred: as above

    tags = [*TAGS, "chat" if facts.kind == "chat" else "base-model"]
    if facts.model_config.get("model_type"):
        tags.append(str(facts.model_config["model_type"]))  # llama, ...
    if facts.gguf:
        tags.append("gguf")
    results = eval_results(facts)
    return ModelCardData(
        language=["ko"],
        license=facts.license,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
        datasets=facts.datasets or None,
        model_name=facts.repo_id.split("/")[-1],
        eval_results=results or None,
    )


# --- body ------------------------------------------------------------------------------------


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows
    ]
    return "\n".join(lines) + "\n"


def _missing(what: str, how: str) -> str:
    return f"_Not in this run: {what}. {how}_\n"


def _get(mapping: dict | None, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def _intro(facts: CardFacts) -> str:
    config = facts.model_config
    what = "chat model" if facts.kind == "chat" else "base (pretrained, not chat-tuned) model"
    size = f"{facts.parameters:,}-parameter " if facts.parameters else ""
    return (
        f"# {facts.repo_id.split('/')[-1]}\n\n"
        f"A {size}Korean {what} trained from scratch with hanlm: corpus → decontamination → "
        "tokenizer → pretraining"
        + (" → chat fine-tuning (SFT)" if facts.kind == "chat" else "")
        + " → evaluation with every benchmark score split into items found in the training data "
        "(dirty) and not (clean). Architecture: "
        f"`{(config.get('architectures') or ['?'])[0]}`, {config.get('num_hidden_layers')} "
        f"layers, hidden size {config.get('hidden_size')}, {config.get('num_attention_heads')} "
        f"attention heads ({config.get('num_key_value_heads')} key/value), vocabulary "
        f"{_num(config.get('vocab_size'))}, context {_num(config.get('max_position_embeddings'))} "
        "tokens.\n\nEvery number below was measured by the run itself and copied from its files; "
        "none is filled in by hand.\n"
    )


def _usage(facts: CardFacts) -> str:
    repo = facts.repo_id
    if facts.kind == "chat":
        code = f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo}")
model = AutoModelForCausalLM.from_pretrained("{repo}")
messages = [{{"role": "user", "content": "한국의 수도는 어디인가요?"}}]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs, max_new_tokens=128, repetition_penalty=1.3)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```
"""
        note = (
            "The chat template (in tokenizer_config.json) wraps each turn in `<|system|>`, "
            "`<|user|>`, `<|assistant|>` and ends it with `<|eot|>`; generation_config.json "
            "stops at `<|eot|>`.\n"
        )
    else:
        code = f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo}")
model = AutoModelForCausalLM.from_pretrained("{repo}")
inputs = tokenizer("대한민국의 수도는", return_tensors="pt")
output = model.generate(**inputs, max_new_tokens=64, repetition_penalty=1.3)
print(tokenizer.decode(output[0], skip_special_tokens=True))
```
"""
        note = "A base model continues text; it has not been tuned to follow the chat template.\n"
    out = ["## How to use\n\n", code, "\n", note]
    out.append(
        "\nWith hanlm installed: `hf download "
        f"{repo} --local-dir model` then `hanlm "
        + ("chat model" if facts.kind == "chat" else 'generate model --prompt "대한민국의 수도는"')
        + "`.\n"
    )
    if facts.gguf:
        out.append(
            f"\n**GGUF** (`{facts.gguf}`, for llama.cpp and Ollama):\n\n```sh\n"
            f"hf download {repo} {facts.gguf} --local-dir .\n"
            f"llama-cli -m {facts.gguf} -cnv\n"
            f"ollama run hf.co/{repo}\n```\n"
        )
    return "".join(out)


def _score_cell(score: Any) -> str:
    if score is None or not _finite(score.value):
        n = score.n if score is not None else None
        return f"- (n={n})" if n is not None else "-"
    text = _num(float(score.value))
    if _finite(score.stderr):
        text += f" ± {_num(float(score.stderr))}"
    return f"{text} (n={score.n})"


def _evaluation(facts: CardFacts) -> str:
    splits: list[str] = []
    for task_splits in facts.scores.values():
        splits += [split for split in task_splits if split not in splits]
    splits = ordered_splits(splits)
    rows = []
    for task, task_splits in facts.scores.items():
        metrics: list[str] = []
        for split in ordered_splits(task_splits):
            metrics += [metric for metric in task_splits[split] or {} if metric not in metrics]
        for metric in metrics:
            row = [task, metric]
            row += [_score_cell(_get(task_splits, split, metric)) for split in splits]
            rows.append(row)
    out = [
        "## Evaluation\n\n",
        "Each score is the mean over items ± its standard error, with the number of items. "
        "`full` is every item; `clean` the items decontamination did not find in the training "
        "data; `dirty` the items it found (whole or in part). A model that only remembers "
        "benchmark items scores higher on `dirty` than on `clean`.\n\n",
        _table(["task", "metric", *splits], rows),
    ]
    if facts.split_note:
        out.append(
            f"\n<details><summary>How the splits are made</summary>\n\n{facts.split_note.strip()}\n\n</details>\n"
        )
    out.append("\n### Decontamination\n\n")
    out.append(_decontamination(facts))
    return "".join(out)


def _decontamination(facts: CardFacts) -> str:
    report = facts.decontam
    if report is None:
        return _missing(
            "a decontamination report (decontam/report.json)",
            "The run did not check its training data for benchmark items, so no score here can "
            "be split into clean and dirty; enable `[decontam]` and run `hanlm run` again.",
        )
    rows = []
    for benchmark, stats in report.benchmarks.items():
        rows.append(
            [benchmark]
            + [_num(value) for value in (stats.items, stats.dirty, stats.partial, stats.clean)]
            + [_num(stats.found_whole), _num(stats.found_only_by_parts)]
        )
    header = ["benchmark", "items checked", "dirty", "partial", "clean", "found whole",
              "found only by parts"]  # fmt: skip
    how = (
        f"Matching: NFC, spaces and punctuation removed, {report.ngram}-character "
        f"n-grams; an item is dirty at coverage ≥ {report.dirty_threshold}, clean "
        f"below {report.clean_threshold}. Scanned "
        f"{_num(report.documents_scanned)} documents "
        f"({_num(report.characters_scanned)} characters); action on the corpus: "
        f"**{report.action}** ({_num(report.documents_dropped)} documents "
        f"dropped, {_num(report.documents_cut)} cut).\n"
    )
    return _table(header, rows) + "\n" + how


def _dataset_line(source: str) -> str:
    found = hf_dataset(source)
    if found is None:
        return (
            "the built-in synthetic Korean demo world"
            if source == "demo" or source.startswith("demo:")
            else f"a local file (`{source.rsplit('/', 1)[-1]}`)"
        )
    name, config, split = found
    extra = ", ".join(part for part in (config, split) if part)
    return f"[{name}](https://huggingface.co/datasets/{name})" + (f" ({extra})" if extra else "")


def _pretraining_rows(facts: CardFacts) -> list[list[Any]]:
    """The pretraining table: from the recipe (when the run kept it), the summary and the log."""
    recipe, summary = facts.recipe, facts.pretrain_summary
    speeds = sorted(r.tokens_per_s for r in facts.pretrain_metrics if _finite(r.tokens_per_s))
    val = [r.val_loss for r in facts.pretrain_metrics if _finite(r.val_loss)]
    mode = summary.mode if summary else recipe.parallel.mode if recipe else None
    optimizer = "-"
    if recipe is not None:
        opt = recipe.optimizer
        name = "Muon (blocks' matrices) with AdamW" if opt.name == "muon" else "AdamW"
        optimizer = (
            f"{name}, lr {opt.lr}, {opt.schedule} schedule, {opt.warmup_steps} warm-up steps"
        )
    return [
        ["preset", recipe.model.init_from or recipe.model.preset if recipe else None],
        ["parameters", _num(facts.parameters)],
        ["tokens seen", _num(summary.tokens if summary else None)],
        ["steps", _num(summary.step if summary else None)],
        ["sequence length", _num(recipe.pretrain.seq_len if recipe else None)],
        ["global batch (tokens)", _num(recipe.pretrain.global_batch_tokens if recipe else None)],
        ["precision", recipe.precision.mode if recipe else None],
        [
            "parallelism",
            f"{mode}, {_num(summary.world_size if summary else None)} process(es)",
        ],
        ["optimizer", optimizer],
        ["validation loss", _num(val[-1]) if val else "-"],
        ["validation bits per byte", _num(summary.val_bpb if summary else None)],
        ["median throughput (tokens/s)", _num(speeds[len(speeds) // 2], 0) if speeds else "-"],
    ]


def _training(facts: CardFacts) -> str:
    summary = facts.pretrain_summary
    out = ["## Training\n\n"]
    if facts.corpus_inputs:
        out.append(
            "Pretraining data: "
            + "; ".join(_dataset_line(source) for source in facts.corpus_inputs)
            + ".\n\n"
        )
    if not summary:
        out.append(
            _missing(
                "a pretraining summary (pretrain/summary.json)", "Run `hanlm run` to finish it."
            )
        )
    out.append(_table(["pretraining", "value"], _pretraining_rows(facts)))
    sft = facts.sft_summary
    if facts.kind == "chat":
        out.append("\n")
        if sft:
            closure = sft.closure
            data = sft.data
            sft_rows = [
                ["steps", _num(sft.step)],
                ["trained tokens", _num(sft.tokens)],
                ["conversations", _num(data.train_conversations if data else None)],
                ["special-token initialisation", sft.init],
                ["untrained template tokens found", ", ".join(sft.untrained_template_tokens or []) or "none"],
                [
                    "answers that end (closure)",
                    f"{closure.closed} / {closure.total}" if closure else "-",
                ],
            ]  # fmt: skip
            out.append(_table(["chat fine-tuning (SFT)", "value"], sft_rows))
        else:
            out.append(_missing("an SFT summary (sft/summary.json)", "Run `hanlm sft` again."))
    return "".join(out)


def _hardware(facts: CardFacts) -> str:
    out = ["## Hardware and cost\n\n"]
    devices = []
    for rank in facts.preflight.ranks if facts.preflight else []:
        for device in rank.device_list():
            devices.append(f"{device.get('name')} ({device.get('type')})")
    if devices:
        counted = {device: devices.count(device) for device in devices}
        hosts = len(set(facts.preflight.hosts)) or 1
        out.append(
            "Measured by preflight: "
            + ", ".join(f"{count} x {device}" for device, count in counted.items())
            + f" on {hosts} host(s), verdict {facts.preflight.verdict}.\n\n"
        )
    else:
        out.append(_missing("a preflight report (preflight.json)", "Run `hanlm preflight`.") + "\n")
    if facts.plan is None or facts.plan.time is None:
        out.append(_missing("a plan (plan.json)", "Run `hanlm plan`."))
        return "".join(out)
    setup, time_ = facts.plan.setup, facts.plan.time
    price = setup.price_per_gpu_hour
    gpu_hours = time_.gpu_hours
    rows = [
        ["GPU", f"{setup.gpus} x {setup.gpu} on {setup.hosts} host(s)"],
        ["planned GPU-hours", _num(gpu_hours, 4)],
        ["planned wall-clock hours", _num(time_.wall_hours, 4)],
        ["price per GPU-hour (USD)", _num(price, 2) if price is not None else "not given"],
    ]
    if _finite(price) and _finite(gpu_hours):
        rows.append(["planned cost (USD)", _num(price * gpu_hours, 2)])
    tokens = facts.pretrain_summary.tokens if facts.pretrain_summary else None
    speeds = sorted(r.tokens_per_s for r in facts.pretrain_metrics if _finite(r.tokens_per_s))
    if speeds and _finite(tokens):
        hours = tokens / speeds[len(speeds) // 2] / 3600
        gpus = (setup.gpus or 1) * (setup.hosts or 1)
        rows.append(["measured training hours (tokens / median tokens/s)", _num(hours, 4)])
        if _finite(price):
            rows.append(["measured cost (USD)", _num(hours * gpus * price, 2)])
    out.append(_table(["", "value"], rows))
    return "".join(out)


def _lessons(facts: CardFacts) -> str:
    out = ["## Report card\n\n"]
    if not facts.report:
        out.append(
            _missing(
                f"a report card ({LESSONS_FILE})",
                "`hanlm run` writes it after evaluation (finished stages are skipped).",
            )
        )
        return "".join(out)
    body = facts.report
    first, _, rest = body.partition("\n")
    if first.startswith("# "):
        body = rest
    # one level deeper: the card's own sections are level 2
    body = re.sub(r"^(#{2,5}) ", lambda match: "#" + match.group(1) + " ", body, flags=re.M)
    out.append(body.strip() + "\n")
    linked = set(re.findall(r"\]\((plots/[^)]+)\)", body))
    unlinked = [plot for plot in facts.plots if plot not in linked]
    if unlinked:
        out.append("\n" + "\n".join(f"![{plot}]({plot})" for plot in unlinked) + "\n")
    return "".join(out)


def _limitations(facts: CardFacts) -> str:
    return (
        "## Limitations\n\n"
        "A small model trained from scratch: it makes facts up, repeats itself without a "
        "repetition penalty, and has had no safety tuning. Scores on `dirty` items measure "
        "memory, not ability; compare models on `clean`.\n"
    )


def body(facts: CardFacts) -> str:
    parts = [_intro(facts), _usage(facts), _evaluation(facts), _training(facts)]
    parts += [_hardware(facts), _lessons(facts), _limitations(facts)]
    return "\n".join(parts)


def render(facts: CardFacts) -> str:
    """The README.md: YAML metadata between `---` lines, then the body."""
    data = card_data(facts)
    return f"---\n{data.to_yaml()}\n---\n\n{body(facts)}"
