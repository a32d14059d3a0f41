"""The report card's figures: small matplotlib PNGs, one function per figure.

Each function takes plain numbers (what report.py read from the run) and a path, writes the PNG
atomically and returns the path. Agg backend: no display needed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GIB = 1 << 30


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.tight_layout()
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def memory_bars(setups: dict[str, dict[str, float]], capacity: float, path: Path) -> Path:
    """Stacked per-GPU memory items of each setup against the device's capacity (bytes)."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    names = list(setups)
    items = list(next(iter(setups.values())))
    bottoms = [0.0] * len(names)
    for item in items:
        values = [setups[n][item] / GIB for n in names]
        ax.barh(names, values, left=bottoms, label=item)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.axvline(capacity / GIB, color="black", linestyle="--", label="device memory")
    ax.set_xlabel("GiB per GPU")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def loss_curves(curves: dict[str, tuple[Sequence[float], Sequence[float]]], path: Path) -> Path:
    """Named (steps, losses) series on one axis."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, (steps, values) in curves.items():
        ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def throughput(steps: Sequence[float], tokens_per_s: Sequence[float], mfu, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(steps, tokens_per_s, color="tab:blue")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("tokens/s", color="tab:blue")
    if mfu and any(m is not None for m in mfu):
        other = ax.twinx()
        other.plot(steps, [m if m is not None else float("nan") for m in mfu], color="tab:red")
        other.set_ylabel("MFU", color="tab:red")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def grouped_bars(
    groups: dict[str, dict[str, float]],
    path: Path,
    *,
    ylabel: str,
    ylim=None,
    intervals: dict[str, dict[str, tuple[float, float]]] | None = None,
) -> Path:
    """groups: {group: {bar: value}}, bars side by side within each group; `intervals`
    ({group: {bar: (low, high)}}) draws an error bar on the bars it names."""
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(groups)), 3.6))
    group_names = list(groups)
    bar_names = sorted({b for g in groups.values() for b in g}, key=_bar_order)
    width = 0.8 / max(1, len(bar_names))
    for i, bar in enumerate(bar_names):
        xs = [j + i * width for j in range(len(group_names))]
        values = [groups[g].get(bar, float("nan")) for g in group_names]
        spans = [(intervals or {}).get(g, {}).get(bar) for g in group_names]
        errors = None
        if any(spans):
            errors = [
                [v - span[0] if span else 0 for v, span in zip(values, spans, strict=True)],
                [span[1] - v if span else 0 for v, span in zip(values, spans, strict=True)],
            ]
        rects = ax.bar(xs, values, width, label=bar, yerr=errors, capsize=3 if errors else 0)
        ax.bar_label(rects, fmt="%.2f", fontsize=7)
    ax.set_xticks([j + width * (len(bar_names) - 1) / 2 for j in range(len(group_names))])
    ax.set_xticklabels(group_names)
    ax.set_ylabel(ylabel)
    ax.axhline(0, color="black", linewidth=0.6)
    if ylim:
        ax.set_ylim(*ylim)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _bar_order(name: str) -> tuple[int, str]:
    order = ["full", "clean", "partial", "dirty", "without penalty", "with penalty"]
    return (order.index(name) if name in order else len(order), name)


def direction_histograms(forward: Sequence[float], reverse: Sequence[float], path: Path) -> Path:
    """Log-probabilities of the right answer asked forward ("A의 수도는") and in reverse."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    low = min([*forward, *reverse], default=-10)
    bins = [low + (0 - low) * i / 30 for i in range(31)]
    ax.hist(forward, bins=bins, alpha=0.6, label=f"forward (mean {_mean(forward):.2f})")
    ax.hist(reverse, bins=bins, alpha=0.6, label=f"reverse (mean {_mean(reverse):.2f})")
    ax.set_xlabel("log-probability of the correct answer")
    ax.set_ylabel("facts")
    ax.legend()
    return _save(fig, path)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
