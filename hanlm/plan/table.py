"""Printing a plan (from `hanlm.plan.estimate.make_plan`) as tables on the terminal."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from hanlm.config import EPOCHS_WARNING
from hanlm.console import console
from hanlm.plan.estimate import Plan

GIB = 1 << 30


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.2f} GiB"


def _hours(hours: float) -> str:
    return f"{hours:,.2f}" if hours < 10 else f"{hours:,.0f}"


def _setup_line(plan: dict[str, Any]) -> str:
    setup, model = plan["setup"], plan["model"]
    hardware = (
        f"{setup['hosts']} x {setup['gpus']} x {setup['gpu']}"
        if setup["gpu"]
        else "no GPU chosen (comparing them)"
    )
    return (
        f"model {setup['model']} ({model['parameters'] / 1e9:.3f}B parameters, "
        f"vocab {model['vocab']:,}), seq {setup['seq_len']}, micro-batch {setup['micro_batch']}, "
        f"{setup['precision']}, {setup['parallel']}, "
        f"{setup['recompute']} recompute, on {hardware}"
    )


def print_plan(typed: Plan) -> None:
    plan = typed.to_json()  # the tables below print every key a plan has
    console.print(f"[bold]plan:[/bold] {_setup_line(plan)}", soft_wrap=True)
    if "options" in plan:
        _print_options(plan)
    else:
        _print_memory(plan["memory"])
        _print_time(plan)
        _print_recommendation(plan.get("recommendation"))
    _print_sft(plan.get("sft"))
    _print_data(plan.get("data"))
    _print_mixture(plan.get("mixture"))


def _fit_cell(mem: dict[str, Any]) -> str:
    if "fits" not in mem:
        return ""
    if mem["fits"]:
        return f"[green]fits[/green], {_gib(mem['margin'])} to spare"
    return f"[red]does not fit[/red]: {_gib(-mem['margin'])} over"


def _print_sft(sft: dict[str, Any] | None) -> None:
    if not sft:
        return
    table = Table(
        title=f"SFT memory per GPU (seq {sft['seq_len']}, micro-batch {sft['micro_batch']})"
    )
    for column in ("sft.method", "trained", "total", ""):
        table.add_column(column, justify="right" if column == "total" else "left")
    lora = (
        f"r{sft['lora_rank']} adapters on {len(sft['lora_targets'])} layer kinds and the chat "
        f"rows: {sft['lora_trained_parameters'] / 1e6:.1f}M parameters"
    )
    if sft["lora_precision"] != sft["precision"]:
        lora += f"; in {sft['lora_precision']} (FP8 does not take LoRA's layers)"
    for method, trained in (("full", "every weight"), ("lora", lora)):
        mem = sft[method]
        mark = " (the recipe's)" if sft["method"] == method else ""
        table.add_row(method + mark, trained, _gib(mem["total"]), _fit_cell(mem))
    console.print(table)


def _tokens(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:,.2f}B"
    return f"{n / 1e6:,.2f}M" if n >= 1e6 else f"{n / 1e3:,.1f}K"


def _print_mixture(rows: list[dict[str, Any]] | None) -> None:
    """Each source's tokens in the budget, the tokens it is estimated to hold, and the epochs."""
    if not rows:
        return
    table = Table(title="training mix (sizes estimated from the raw inputs)")
    for column in ("source", "share asked", "tokens", "holds (est.)", "reads", "epochs"):
        table.add_column(column, justify="left" if column == "source" else "right")
    notes = []
    for row in rows:
        asked = f"{row['weight']:.1%}" if row["weight"] is not None else "tokens"
        held = _tokens(row["available"]) if row["available"] is not None else "not sized"
        reads = _tokens(row["reads"]) if row.get("reads") is not None else "whole"
        epochs = f"{row['epochs']:,.2f}" if row["epochs"] is not None else "-"
        if row["short_of_budget"] > 0:
            notes.append(
                f"[red]{row['source']}: capped at max_epochs {row['max_epochs']:g}: the mix "
                f"falls short by {row['short_of_budget']:.1%} of the budget[/red]"
            )
        elif row["epochs"] is not None and row["epochs"] > EPOCHS_WARNING:
            notes.append(
                f"[yellow]{row['source']}: past ~{EPOCHS_WARNING:g} epochs repeats are worth "
                "less[/yellow]"
            )
        table.add_row(row["source"], asked, _tokens(row["tokens"]), held, reads, epochs)
    console.print(table)
    for note in notes:
        console.print(note, soft_wrap=True)
    console.print(
        'reads: the tokens\' worth of text the corpus stage reads of a source read "needed" '
        "(its share x corpus.read_margin; whole when it holds less); a larger budget reads "
        "more, and the corpus stage then runs again. The shards give each source's exact "
        "tokens; pretraining plans the mix on them and stops before its first step when a "
        "share cannot be met within max_epochs.",
        soft_wrap=True,
    )


def _print_memory(mem: dict[str, Any]) -> None:
    table = Table(title="memory per GPU")
    table.add_column("item")
    table.add_column("size", justify="right")
    for name, size in mem["items"].items():
        table.add_row(name, _gib(size))
    table.add_row("[bold]total[/bold]", f"[bold]{_gib(mem['total'])}[/bold]")
    if mem.get("capacity") is not None:
        table.add_row("device memory", _gib(mem["capacity"]))
    console.print(table)
    if "fits" in mem:
        if mem["fits"]:
            console.print(f"[green]fits[/green], {_gib(mem['margin'])} to spare")
        else:
            console.print(f"[red]does not fit[/red]: {_gib(-mem['margin'])} over")


def signed_share(share: float) -> str:
    """+15%, -3%, or ±0% for a share that rounds to nothing (never "+-0%")."""
    percent = round(share * 100)
    return f"{percent:+d}%" if percent else "±0%"


def _print_time(plan: dict[str, Any]) -> None:
    timing = plan["time"]
    table = Table(title="time and cost")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("MFU", f"{timing['mfu']:.0%} ({timing['mfu_source']})")
    table.add_row(
        "tokens per optimizer step",
        f"{timing['tokens_per_step']:,} ({timing['accumulation']} micro-steps)",
    )
    table.add_row("compute per step", f"{timing['compute_s']:.3f} s")
    table.add_row("communication per step", f"{timing['comm_s']:.3f} s over {timing['comm_link']}")
    table.add_row("not hidden by compute", f"{timing['exposed_comm_s']:.3f} s")
    table.add_row("throughput", f"{timing['tokens_per_s']:,.0f} tokens/s")
    if "gpu_hours" in timing:
        table.add_row("GPU-hours (6·N·D)", f"{timing['gpu_hours']:,.1f}")
        table.add_row("wall time", f"{timing['wall_hours']:,.1f} h")
        # the exact count: every matmul and attention, no embedding; a large vocabulary with a
        # short context counts less than 6·N
        table.add_row(
            "GPU-hours counting each matmul and attention",
            f"{timing['gpu_hours_with_attention']:,.1f} "
            f"({signed_share(timing['attention_adds'])} against 6·N·D)",
        )
    if timing.get("optimizer_note"):
        table.add_row("optimizer", timing["optimizer_note"])
    if "cost" in timing:
        table.add_row(
            "cost",
            f"{timing['cost']:,.0f} USD ({timing['cost_with_attention']:,.0f} counted exactly)",
        )
    console.print(table)


def _print_recommendation(rec: dict[str, Any] | None) -> None:
    if rec is None:
        console.print(
            "[red]no configuration of 1, 2, 4, 8 or the given number of GPUs fits[/red]: add GPUs "
            "(FSDP shards the "
            "model state), or choose a GPU with more memory"
        )
        return
    table = Table(title="cheapest configurations that fit (by GPU-hours)")
    for column in (
        "GPUs",
        "parallel",
        "recompute",
        "micro-batch",
        "memory",
        "tokens/s",
        "GPU-h",
        "cost",
    ):
        table.add_column(column, justify="right")
    for i, row in enumerate([rec["best"], *rec["alternatives"]]):
        style = "bold green" if i == 0 else None
        table.add_row(
            f"{row['hosts']}x{row['gpus']}",
            row["parallel"],
            row["recompute"],
            str(row["micro_batch"]),
            f"{row['memory_gib']:.1f} GiB",
            f"{row['tokens_per_s']:,.0f}",
            _hours(row["gpu_hours"]) if "gpu_hours" in row else "-",
            f"{row['cost']:,.0f} USD" if "cost" in row else "-",
            style=style,
        )
    console.print(table)


def _print_options(plan: dict[str, Any]) -> None:
    table = Table(title="which GPUs can train it (FSDP over one host)")
    for column in ("GPU", "memory", "fewest GPUs that fit", "GPU-hours"):
        table.add_column(column)
    for row in plan["options"]:
        table.add_row(
            f"{row['gpu']} ({row['name']})",
            f"{row['memory_gb']:g} GB",
            row.get("note") or str(row.get("min_gpus", "more than 64")),
            _hours(row["gpu_hours"]) if "gpu_hours" in row else "-",
        )
    console.print(table)
    console.print(
        "Choose hardware with --gpu NAME --gpus N [--hosts N]; add --tokens and "
        "--price-per-gpu-hour for time and cost, --mfu to override the typical utilisation.",
        soft_wrap=True,
    )


def _duration(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:,.0f} min" if hours * 60 >= 1 else "under a minute"
    return f"{hours:,.1f} h"


def _print_data(data: dict[str, Any] | None) -> None:
    if data is None:
        console.print(
            "data stages: no estimate, the corpus size is unknown: set plan.corpus_gb "
            "(--corpus-gb), or a token target (--tokens)",
            soft_wrap=True,
        )
        return
    gb = data["corpus_gb"]
    size = f"{gb:,.1f} GB" if gb >= 1 else f"{gb * 1000:,.1f} MB"
    size += " (estimate)" if data["size_estimated"] else ""
    table = Table(title=f"data stages: {size} on {data['cores']:,} cores")
    for column in ("stage", "work", "MB/s per core", "MB/s", "wall time"):
        table.add_column(column, justify="left" if column in ("stage", "work") else "right")
    for name, stage in data["stages"].items():
        if "skipped" in stage:
            table.add_row(name, f"skipped ({stage['skipped']})", "-", "-", "-")
            continue
        table.add_row(
            name,
            stage["what"],
            f"{stage['mb_per_s_per_core']:.3g}",
            f"{stage['mb_per_s']:,.0f}",
            _duration(stage["hours"]),
        )
    table.add_row(
        "[bold]total[/bold]", "", "", "", f"[bold]{_duration(data['total_hours'])}[/bold]"
    )
    console.print(table)
    sources = "; ".join(
        f"{name} {stage['measured_by']}"
        for name, stage in data["stages"].items()
        if "measured_by" in stage
    )
    corpus = data["stages"].get("corpus", {})
    formats = (
        f" The corpus stage reads {corpus['parquet_share']:.0%} of it from parquet, at "
        f"{corpus['parquet_mb_per_s_per_core']:g} MB/s per core, the rest at "
        f"{corpus['text_mb_per_s_per_core']:g} (JSONL and text): "
        f"{corpus['mb_per_s_per_core']:.1f} in all."
        if "parquet_share" in corpus
        else ""
    )
    console.print(
        f"corpus size: {data['size_basis']}.{formats} Cores: {data['cores']:,} "
        f"({data['cores_basis']}), "
        f"each after the first adding {data['scaling_efficiency']:.0%} of one "
        f"({data['effective_cores']:,.1f} effective). Rates measured on the reference machine "
        f"(hanlm/plan/data_rates.py): {sources}. Each stage is counted on the whole raw corpus "
        "(dedup and decontam shrink what later stages read): an upper bound."
        + (
            " Streamed hf: inputs arrive no faster than the network brings them: at this "
            "rate download them first (the corpus stage's offline message says how)."
            if "hf:" in data["size_basis"]
            else ""
        ),
        soft_wrap=True,
        markup=False,
        emoji=False,  # dataset ids such as hf:NAME:train: are not emoji codes
    )
