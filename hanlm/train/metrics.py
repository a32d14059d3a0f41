"""Training metrics: metrics.jsonl always, the experiment trackers of [logging] (train/trackers.py:
TensorBoard, trackio, W&B) with the same records, a rich progress bar.

Only rank 0 writes. On resume, records past the resumed step (written after the last checkpoint
of a crashed run) are dropped so the file reads as one consistent run.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch

from hanlm.console import console, progress
from hanlm.files import atomic_write_text
from hanlm.train.trackers import Trackers, TrackerSetup, open_trackers


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated GPU memory, or this process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 1e9 if sys.platform == "darwin" else rss * 1024 / 1e9


class MetricsLog:
    def __init__(
        self,
        path: Path,
        *,
        enabled: bool,
        total_steps: int,
        start_step: int,
        trackers: TrackerSetup | None = None,
    ):
        """`trackers`: the trackers that receive every record too (None: metrics.jsonl only)."""
        self.path, self.enabled = Path(path), enabled
        self._trackers = Trackers({})
        self._bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        if trackers is not None:  # first: a tracker that cannot start leaves nothing open
            self._trackers = open_trackers(trackers, self.path.parent, start_step=start_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._bar = progress(transient=False)
        self._bar.start()
        self._task = self._bar.add_task("train", total=total_steps, completed=start_step)

    def _truncate_after(self, step: int) -> None:
        """Drop records past `step` and a line torn by a crash mid-write."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def log(self, record: dict, *, show: bool = True) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        self._trackers.log(record)
        self._bar.update(self._task, completed=record["step"])
        if show:
            console.print(_format(record))

    def close(self, outcome: str = "finished") -> None:
        """Close the file and finish the trackers; outcome: "finished", "failed" or
        "preempted" (what the trackers record the run as)."""
        if not self.enabled:
            return
        self._bar.stop()
        self._file.close()
        self._trackers.close(outcome)


def _format(record: dict) -> str:
    parts = [f"step {record['step']}"]
    for key, fmt in (
        ("loss", ".4f"),
        ("val_loss", ".4f"),
        ("val_bpb", ".4f"),
        ("lr", ".2e"),
        ("grad_norm", ".3f"),
        ("tokens_per_s", ",.0f"),
        ("mfu", ".1%"),
        ("peak_memory_gb", ".2f"),
    ):
        if key in record and record[key] is not None:
            parts.append(f"{key} {format(record[key], fmt)}")
    return "  ".join(parts)
