"""Training batches read ahead in a background thread and on the device before they are needed.

`Prefetcher` wraps a loader with the trainer's contract (`next_batch()` giving `(inputs, labels)`
or `(inputs, labels, extra)`, where `extra` is a dict of further model inputs such as
`position_ids`; `state_dict()`, `load_state_dict()`). A daemon thread calls the loader's
`next_batch()` ahead of the loop, counts the trained labels on the host (so the step never asks
the device how many tokens it has), pins the tensors and, on CUDA, copies them to the device on a
side stream; the main thread waits for that copy on its own stream only when it takes the batch.

Resume stays exact: with each batch the thread records the loader's state *after* it, and
`state_dict()` answers the state after the last batch the trainer took, so batches read ahead
but not used are not counted as consumed. `load_state_dict()` stops the thread, drops what it read
ahead and restarts it lazily from the loaded position.

An exception in the thread is raised in the main thread when the trainer reaches the batch that
failed (with the thread's traceback). `close()` stops the thread; it is a daemon, so a run that
stops early or is preempted never waits on it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

IGNORE = -100
_POLL_S = 0.1  # how often a blocked thread or reader looks at the stop flag
_JOIN_S = 30.0  # how long close() waits for a read in progress


@dataclass
class Batch:
    """One micro-batch on the device; `tokens` is the count of labels that are not IGNORE, a
    0-dim int64 tensor on the device (read it only when a log line needs it)."""

    inputs: torch.Tensor
    labels: torch.Tensor
    tokens: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Ready:
    batch: Batch
    state_after: dict
    copied: Any = None  # a CUDA event the consumer's stream waits on; None off CUDA


@dataclass
class _Failed:
    error: BaseException


def _split(raw) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(inputs, labels, extra inputs) of what a loader's next_batch() returned."""
    if isinstance(raw, (tuple, list)) and len(raw) in (2, 3):
        extra = raw[2] if len(raw) == 3 and raw[2] is not None else {}
        if not isinstance(extra, Mapping) or not all(
            isinstance(v, torch.Tensor) for v in extra.values()
        ):
            raise TypeError("a batch's third item must be a dict of tensors (extra model inputs)")
        return raw[0], raw[1], dict(extra)
    raise TypeError(
        f"a loader's next_batch() must return (inputs, labels) or (inputs, labels, extra), "
        f"got {type(raw).__name__}"
    )


class Prefetcher:
    """Reads `depth` micro-batches ahead of the trainer; see the module docstring."""

    def __init__(self, loader, device: torch.device, *, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.loader, self.device, self.depth = loader, torch.device(device), depth
        self._cuda = self.device.type == "cuda"
        self._state = loader.state_dict()  # the position after the last batch handed out
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._failed = self._hung = False

    # -- the loader's contract -------------------------------------------------------------------

    def next_batch(self) -> Batch:
        if self._failed or self._hung:
            raise RuntimeError("the batch reader failed or hung earlier; it cannot continue")
        if self._thread is None:
            self._start()
        item = self._take()
        if isinstance(item, _Failed):
            self._failed = True
            self.close()
            raise item.error
        if item.copied is not None:  # the side stream's copy must land before the step reads it
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(item.copied)
            for tensor in _tensors(item.batch):
                tensor.record_stream(stream)  # its memory belongs to the side stream's pool
        self._state = item.state_after
        return item.batch

    def state_dict(self) -> dict:
        return dict(self._state)

    def load_state_dict(self, state: Mapping) -> None:
        self.close()  # what was read ahead belongs to the old position
        if self._hung:
            raise RuntimeError("the batch reader hung in a read; the loader cannot be reused")
        self.loader.load_state_dict(state)
        self._state, self._failed = self.loader.state_dict(), False

    def close(self) -> None:
        """Stop the thread and drop what it read ahead; the next next_batch() restarts it."""
        if self._thread is None:
            return
        self._stop.set()
        while True:  # unblock a put() waiting for room
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=_JOIN_S)
        if self._thread.is_alive():  # stuck in a read: leave the daemon, never reuse the loader
            self._hung = True
        self._thread = self._queue = self._stop = None

    # -- the thread ------------------------------------------------------------------------------

    def _start(self) -> None:
        # A thread stopped by close() may have read past the last batch handed out: rewind.
        self.loader.load_state_dict(self._state)
        self._queue, self._stop = queue.Queue(maxsize=self.depth), threading.Event()
        self._thread = threading.Thread(
            target=self._fill, args=(self._queue, self._stop), name="hanlm-prefetch", daemon=True
        )
        self._thread.start()

    def _take(self):
        while True:
            try:
                return self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive():  # cannot happen unless the interpreter is exiting
                    raise RuntimeError("the batch reader stopped without a reason") from None

    def _fill(self, out: queue.Queue, stop: threading.Event) -> None:
        stream = None
        if self._cuda:
            if self.device.index is not None:  # the thread's current device is not inherited
                torch.cuda.set_device(self.device)
            stream = torch.cuda.Stream(self.device)
        while not stop.is_set():
            try:
                item = self._read_one(stream)
            except BaseException as error:  # handed to the main thread, which raises it
                item = _Failed(error)
            while not stop.is_set():
                try:
                    out.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failed):
                return

    def _read_one(self, stream) -> _Ready:
        inputs, labels, extra = _split(self.loader.next_batch())
        state_after = self.loader.state_dict()
        tokens = (labels != IGNORE).sum()  # on the host: no device sync in the step
        host = Batch(inputs, labels, tokens, extra)
        if stream is None:
            return _Ready(_moved(host, self.device, pin=False), state_after)
        with torch.cuda.stream(stream):
            batch = _moved(host, self.device, pin=True)
            copied = torch.cuda.Event()
            copied.record(stream)
        return _Ready(batch, state_after, copied)


def _tensors(batch: Batch) -> list[torch.Tensor]:
    return [batch.inputs, batch.labels, batch.tokens, *batch.extra.values()]


def _moved(batch: Batch, device: torch.device, *, pin: bool) -> Batch:
    def move(tensor: torch.Tensor) -> torch.Tensor:
        if pin and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=True)

    return Batch(
        move(batch.inputs),
        move(batch.labels),
        move(batch.tokens),
        {name: move(tensor) for name, tensor in batch.extra.items()},
    )
