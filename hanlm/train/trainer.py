"""One explicit training loop for pretraining and SFT.

Per optimizer step: take the step's micro-batches (inputs, labels, and for rows of packed
documents their extra model inputs: hanlm.train.document_attention), read ahead and already on
the device (train/prefetch.py), start summing their target tokens over all ranks, run
forward/backward on each with the loss summed over tokens, then divide the gradients by the
global count (so one process and N ranks with the same global batch compute the same gradient),
clip, step, then log, validate and checkpoint when due. The model's forward ends in the loss
(hanlm.train.loss): the logits of a whole micro-batch are never made.

Nothing in the step waits for the device: the token counts come from the loader's thread, their
all-reduce is asynchronous, and the numbers of a log line (loss, tokens, grad norm) are read only
when the line is written. A step whose gradient norm is NaN or inf has its update skipped on the
device (fused AdamW's found_inf, as under a GradScaler); the host reads whether a step's loss and
norm were finite one step late, when the next step is already queued, and training stops after
`max_nonfinite_steps` such steps in a row, every rank together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from hanlm.errors import UserError
from hanlm.train import checkpoint, checkpoint_layout, document_attention, parallel, prefetch
from hanlm.train.checkpoint_manager import CheckpointError, CheckpointManager
from hanlm.train.loss import Objective, TokenLoss, with_loss
from hanlm.train.metrics import MetricsLog, peak_memory_gb
from hanlm.train.optim import lr_at
from hanlm.train.preemption import Preempted, PreemptionWatch
from hanlm.train.trackers import TrackerSetup

IGNORE = -100


@dataclass
class Schedule:
    """The learning rate of each step: the keywords of optim.lr_at."""

    total_steps: int
    peak: float
    warmup_steps: int
    min_ratio: float
    schedule: str
    decay_fraction: float

    def lr(self, step: int) -> float:
        return lr_at(step, **dataclasses.asdict(self))


@dataclass
class TrainerSettings:
    accumulation: int
    grad_clip: float
    log_every: int
    eval_every: int
    eval_batches: int
    checkpoint_every: int
    flops_per_token: float
    peak_flops: float
    fingerprint: str  # model and data: a checkpoint must match it to be resumed
    settings: str = ""  # every setting of the stage: a finished run with other ones is not reused
    max_nonfinite_steps: int = 3  # steps in a row with a NaN/inf loss or gradient norm, then stop
    optimizer_keys: str = "optimizer"  # the config section of the optimizer, for messages


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    history: list[dict] = field(default_factory=list)


def _step_of_latest(root) -> int | None:
    path = checkpoint_layout.latest(root)
    return int(path.name.split("-")[1]) if path is not None else None


class _Window:
    """The loss, its parts and the tokens summed since the last log line."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), device=self.device)
        self.parts: dict[str, torch.Tensor] = {}
        self.tokens, self.start = 0, time.perf_counter()

    def add(self, out: dict) -> None:
        self.loss += out["loss_sum"]
        for name, value in out["parts"].items():
            self.parts[name] = self.parts.get(name, 0) + value
        self.tokens += out["tokens"]

    def state_dict(self, dist: parallel.Dist) -> dict:
        """The window summed over ranks (every rank calls it: a checkpoint is saved by all), so
        that a run resumed mid-window logs the same average over the same steps as one that
        was never stopped."""
        names = sorted(self.parts)
        sums = torch.stack([self.loss, *(self.parts[name] for name in names)]).float()
        loss, *parts = parallel.all_reduce_sum(sums, dist).tolist()  # float32 values, exactly
        return {
            "loss": loss,
            "parts": dict(zip(names, parts, strict=True)),
            "tokens": int(self.tokens),  # already the count over all ranks
            "seconds": time.perf_counter() - self.start,
        }

    def load_state_dict(self, state: dict, *, holds_sums: bool) -> None:
        """Continue a saved window; only one rank (`holds_sums`) takes the sums over ranks, as
        they are summed over ranks again when the line is logged."""
        share = 1.0 if holds_sums else 0.0
        self.loss = torch.tensor(state["loss"] * share, device=self.device)
        self.parts = {
            name: torch.tensor(value * share, device=self.device)
            for name, value in state["parts"].items()
        }
        self.tokens = state["tokens"]
        self.start = time.perf_counter() - state["seconds"]


class _Readback:
    """A few device numbers copied to the host behind the work queued so far: reading them
    later waits for that work only, not for what was queued after (a plain .tolist() would
    wait for the whole queue, the next step included)."""

    def __init__(self, values: torch.Tensor):
        self.ready = None
        if values.device.type == "cuda":
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()
        else:
            self.host = values

    def tolist(self) -> list:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


@dataclass
class _NonfiniteRun:
    """The steps in a row whose loss or gradient norm was NaN or inf (their updates skipped)."""

    count: int = 0
    first_step: int = 0
    loss: float = 0.0  # this rank's summed loss at the first of them
    grad_norm: float = 0.0

    def add(self, step: int, nonfinite: bool, loss: float, grad_norm: float) -> None:
        if not nonfinite:
            self.count = 0
        elif self.count == 0:
            self.count, self.first_step, self.loss, self.grad_norm = 1, step, loss, grad_norm
        else:
            self.count += 1

    def detail(self) -> str:
        bad = [
            f"the {name} was {value}"
            for name, value in (("loss", self.loss), ("gradient norm", self.grad_norm))
            if not math.isfinite(value)
        ]
        return " and ".join(bad) or "another rank's loss was not finite"


def _on_device(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(inputs, labels, extra model inputs) of a loader's batch, on `device`."""
    inputs, labels, *rest = batch
    extra = rest[0] if rest else {}
    return (
        inputs.to(device, non_blocking=True),
        labels.to(device, non_blocking=True),
        {name: value.to(device, non_blocking=True) for name, value in extra.items()},
    )


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def _all_reduce_async(values: torch.Tensor, dist: parallel.Dist):
    """Start summing `values` over ranks in place; the work to wait on, None alone."""
    if not dist.distributed:
        return None
    return torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.SUM, async_op=True)


class Trainer:
    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_loader,
        val_loader,
        schedule: Schedule,
        settings: TrainerSettings,
        dist: parallel.Dist,
        mode: str,
        numerics,
        metrics_path: Path,
        checkpoints: CheckpointManager,
        token_bytes: torch.Tensor | None = None,
        after_optimizer_step=None,
        every_minutes: float = 0,
        loss: TokenLoss | None = None,
        objective_for=None,
        trackers: TrackerSetup | None = None,
    ):
        self.model, self.optimizer = with_loss(model), optimizer
        # Two steps of micro-batches read ahead: the next step's are ready while this one runs.
        self.train_loader = prefetch.Prefetcher(
            train_loader, dist.device, depth=2 * settings.accumulation
        )
        self.val_loader = val_loader
        self.schedule, self.settings, self.dist = schedule, settings, dist
        self.mode, self.numerics = mode, numerics
        self.metrics_path = Path(metrics_path)
        self.checkpoints = checkpoints
        self.every_minutes = every_minutes
        self.preemption = PreemptionWatch()
        self.token_bytes = token_bytes.to(dist.device) if token_bytes is not None else None
        self.after_optimizer_step = after_optimizer_step
        # how the loss is computed from the hidden states (chunk size, kernel)
        self.loss = loss or TokenLoss()
        # objective_for(inputs, extra) -> the loss of a chunk of tokens (hanlm.train.loss.Objective:
        # {"loss": summed loss to minimise, other summed parts to log per token, e.g. "ce", "kl"});
        # None: token-summed cross-entropy. extra: the batch's extra model inputs (a packed
        # batch's position_ids), {} for plain rows.
        self.objective_for = objective_for
        self.trackers = trackers  # where rank 0 sends the metrics records besides metrics.jsonl
        self.state = TrainState()
        self._unread_tokens: torch.Tensor | None = None  # trained since state.tokens was updated
        # (step, [loss sum, grad norm]) of the last step, on its way to the host: read one step late
        self._unread_health: tuple[int, _Readback] | None = None
        self._nonfinite = _NonfiniteRun()
        self._window = _Window(dist.device)
        self._resumed_window: dict | None = None  # the window a checkpoint saved mid-way
        # FLOP/s per rank that MFU counts against. A CPU's is measured (one matmul, once, on a
        # machine that may be busy then): a lower bound, raised to what training reaches, so
        # the figure never reads over 100%. A GPU's comes from the catalogue and stays.
        self._peak_flops = settings.peak_flops

    # -- resume --------------------------------------------------------------------------------

    def resume(self) -> bool:
        candidate = checkpoint_layout.latest(self.checkpoints.root)
        if candidate is not None:
            # Compare before loading: another model's tensors would fail with a shape error.
            self._check_compatible(candidate, checkpoint_layout.read_trainer_state(candidate))
        saved = self.checkpoints.load_latest(
            parallel.unwrap(self.model), self.optimizer, self.settings.fingerprint
        )
        if saved is None:
            return False
        self._check_compatible(self.checkpoints.root, saved)
        self.state.step, self.state.tokens = saved["step"], saved["tokens"]
        self._unread_tokens = None
        self._resumed_window = saved.get("window")  # absent from checkpoints made before it
        self.train_loader.load_state_dict(saved["loader"])
        checkpoint.set_rng_state(saved.get("rng", {}))
        return True

    def _check_compatible(self, where, saved: dict) -> None:
        if saved.get("fingerprint") != self.settings.fingerprint:
            raise UserError(
                f"the checkpoints in {where} were made with another model, data or seed",
                fix="start a new run directory, or rerun with --resume never (or --force) to "
                "train from scratch",
            )
        total = self.schedule.total_steps
        if saved["step"] >= total and saved.get("settings") != self.settings.settings:
            raise UserError(
                f"this run already trained {saved['step']} steps with other settings; "
                f"nothing is left to train for {total} steps",
                fix="rerun with --force (or --resume never) to train again with the new settings, "
                "or raise --max-steps to continue",
            )

    def save(self, *, sync: bool = False) -> float:
        """Checkpoint the current step; returns the seconds the loop was blocked."""
        state = {
            "step": self.state.step,
            "tokens": self.tokens(),
            "loader": self.train_loader.state_dict(),
            "lr": self.schedule.lr(max(self.state.step - 1, 0)),
            "fingerprint": self.settings.fingerprint,
            "settings": self.settings.settings,
            "rng": checkpoint.rng_state(),
            "window": self._window.state_dict(self.dist),
        }
        self._last_save = time.monotonic()
        return self.checkpoints.save(
            self.state.step, parallel.unwrap(self.model), self.optimizer, state, sync=sync
        )

    def tokens(self) -> int:
        """Target tokens trained so far, all ranks together (waits for the device)."""
        if self._unread_tokens is not None:
            self.state.tokens += int(self._unread_tokens.item())
            self._unread_tokens = None
        return self.state.tokens

    # -- one step --------------------------------------------------------------------------------

    def _model_inputs(self, inputs: torch.Tensor, extra: dict) -> dict[str, object]:
        """The model's keyword inputs for a micro-batch: its token ids and, for packed rows,
        their positions and document mask."""
        return {"input_ids": inputs, **document_attention.model_inputs(self.model, extra)}

    def _loss_sums(
        self, inputs: torch.Tensor, labels: torch.Tensor, extra: dict
    ) -> dict[str, torch.Tensor]:
        objective: Objective | None = None
        if self.objective_for is not None:
            objective = self.objective_for(inputs, extra)
        loss_fn = functools.partial(self.loss.sums, objective=objective)
        with self.numerics.autocast_context(self.dist.device):
            return self.model(labels=labels, loss_fn=loss_fn, **self._model_inputs(inputs, extra))

    def train_step(self) -> dict:
        step = self.state.step
        lr = self.schedule.lr(step)
        for group in self.optimizer.param_groups:
            # a group may train faster or slower than the schedule (SFT's new token rows)
            group["lr"] = lr * group.get("lr_scale", 1.0)
        micro = [self.train_loader.next_batch() for _ in range(self.settings.accumulation)]
        # The global count is summed over ranks while the backward runs: the gradients are
        # divided by it afterwards, so the host never waits for it.
        tokens = torch.stack([batch.tokens for batch in micro]).sum()
        summing = _all_reduce_async(tokens, self.dist)
        loss_sum = torch.zeros((), device=self.dist.device, dtype=torch.float32)
        parts: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1
            with parallel.no_sync(self.model, self.mode, last):
                sums = self._loss_sums(batch.inputs, batch.labels, batch.extra or {})
                sums["loss"].backward()
            loss_sum += sums["loss"].detach()
            for name, value in sums.items():
                if name != "loss":
                    parts[name] = parts.get(name, 0) + value.detach().float()
        if summing is not None:
            summing.wait()  # on NCCL the stream waits, not the host
        # DDP and FSDP average gradients over ranks; scaling by world size turns that into a sum.
        grad_norm = self._scale_and_clip(
            (self.dist.world_size / tokens.clamp(min=1).double()).float()
        )
        self._step_unless_nonfinite(grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        if self.after_optimizer_step is not None:
            self.after_optimizer_step()
        self.state.step += 1
        self._unread_tokens = (
            tokens if self._unread_tokens is None else self._unread_tokens + tokens
        )
        return {
            "loss_sum": loss_sum,
            "parts": parts,
            "tokens": tokens,  # a device tensor: read it at log time
            "lr": lr,
            "grad_norm": grad_norm,  # a device tensor: read it at log time
        }

    def _step_unless_nonfinite(self, grad_norm: torch.Tensor) -> None:
        """The optimizer's update, skipped when the gradient norm is NaN or inf, so that the
        weights (and every checkpoint of them) stay finite. The norm is the same on every rank
        (DDP's gradients are averaged, FSDP's norm is all-reduced): all ranks skip together."""
        nonfinite = ~torch.isfinite(grad_norm)
        if getattr(self.optimizer, "_step_supports_amp_scaling", False):
            # fused AdamW skips on the device, as under a GradScaler: the host does not wait
            self.optimizer.found_inf = nonfinite.float()
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        elif not nonfinite.item():  # an optimizer without found_inf: the host has to look
            self.optimizer.step()

    @torch.no_grad()
    def _scale_and_clip(self, scale: torch.Tensor) -> torch.Tensor:
        """Multiply the gradients by `scale` and clip them, in one pass; their norm after."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.dist.device)
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):  # FSDP: each rank holds the norm of its shards
            norm = norm.full_tensor()
        norm = norm * scale
        factor = scale
        if self.settings.grad_clip > 0:
            factor = scale * (self.settings.grad_clip / (norm + 1e-6)).clamp(max=1.0)
        # FSDP's gradients are DTensors: scaling each rank's shard scales the whole.
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        torch._foreach_mul_(local, factor)
        return norm

    # -- validation ------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict:
        if self.val_loader is None:
            return {}
        self.model.eval()
        device = self.dist.device
        totals = torch.zeros(
            4, device=device, dtype=torch.float64
        )  # loss, tokens, byte-loss, bytes
        sources = getattr(self.val_loader, "source_names", [])
        by_source = torch.zeros(len(sources), 2, device=device, dtype=torch.float64)
        if len(sources) > 1:  # each row's source: a loss per source from the same batches
            batches = self.val_loader.eval_batches_with_sources(self.settings.eval_batches)
        else:
            batches = ((None, b) for b in self.val_loader.eval_batches(self.settings.eval_batches))
        for row_sources, batch in batches:
            inputs, labels, extra = _on_device(batch, device)
            with self.numerics.autocast_context(device):
                per_token = self.model(
                    labels=labels,
                    loss_fn=self.loss.token_losses,
                    **self._model_inputs(inputs, extra),
                )
            valid = labels.view(-1) != IGNORE
            totals[0] += per_token[valid].sum().double()
            totals[1] += valid.sum()
            if row_sources is not None:
                rows = torch.as_tensor(row_sources, device=device)
                kept = torch.where(valid, per_token.double(), 0.0).view(labels.shape)
                by_source[:, 0].index_add_(0, rows, kept.sum(1))
                by_source[:, 1].index_add_(0, rows, valid.view(labels.shape).sum(1).double())
            if self.token_bytes is not None:
                nbytes = self.token_bytes[labels.view(-1).clamp(min=0)] * valid
                totals[2] += (per_token * (nbytes > 0)).sum().double()
                totals[3] += nbytes.sum()
        self.model.train()
        parallel.all_reduce_sum(totals, self.dist)
        if totals[1] == 0:
            return {}
        out: dict = {"val_loss": float(totals[0] / totals[1])}
        if len(sources) > 1:
            parallel.all_reduce_sum(by_source, self.dist)
            out["val_loss_by_source"] = {
                name: float(loss / n)
                for name, (loss, n) in zip(sources, by_source.tolist(), strict=True)
                if n > 0
            }
        if totals[3] > 0:
            out["val_bpb"] = float(totals[2] / (math.log(2) * totals[3]))
        return out

    # -- the loop --------------------------------------------------------------------------------

    def fit(self, *, stop_after_steps: int | None = None) -> dict:
        total = self.schedule.total_steps
        start = self.state.step
        log = self._open_log(total, start)
        self.model.train()
        window = self._window = _Window(self.dist.device)
        if self._resumed_window is not None:
            window.load_state_dict(self._resumed_window, holds_sums=self.dist.is_main)
            self._resumed_window = None
        self._unread_health, self._nonfinite = None, _NonfiniteRun()
        last_eval: dict = {}
        stopped_early = preempted = False
        outcome = "failed"  # what the trackers record, unless the loop ends normally
        self._last_save = time.monotonic()
        self.preemption.install()
        try:
            if start >= total:  # resumed from the final checkpoint, its stage not marked done:
                last_eval = self.evaluate()  # the summary still gets the final validation
            while self.state.step < total:
                out = self.train_step()
                window.add(out)
                step = self.state.step
                evaluated = self._log_when_due(out, window, log)
                if evaluated is not None:
                    last_eval = evaluated
                flags = self._step_flags(out, final=step == total)
                self.checkpoints.finish_if_written(any_pending=flags["pending"])
                if flags["preempt"]:
                    self.save(sync=True)
                    preempted = True
                    break
                self._save_when_due(flags)
                if stop_after_steps is not None and step - start >= stop_after_steps:
                    self.checkpoints.wait()
                    stopped_early = step < total
                    break
        except BaseException:
            self.checkpoints.abandon()  # no collectives on the way out: a peer may be gone
            raise
        else:
            self.checkpoints.close()
            outcome = "preempted" if preempted else "finished"
        finally:
            self.train_loader.close()  # what it read ahead is not consumed: state_dict says so
            self.preemption.uninstall()
            log.close(outcome)
        if preempted:
            raise Preempted(
                f"stopped by a signal after step {self.state.step}; the checkpoint "
                f"{checkpoint_layout.latest(self.checkpoints.root)} is committed: run the same "
                "command to continue"
            )
        return {
            "step": self.state.step,
            "tokens": self.tokens(),
            "completed": self.state.step >= total and not stopped_early,
            **last_eval,
        }

    def _open_log(self, total: int, start: int) -> MetricsLog:
        """The metrics log with its trackers (written by rank 0). Every rank learns whether it
        opened: a tracker that cannot start stops all ranks, not only rank 0 while the others
        wait in the first step's collectives."""
        log, error = None, None
        try:
            log = MetricsLog(
                self.metrics_path,
                enabled=self.dist.is_main,
                total_steps=total,
                start_step=start,
                trackers=self.trackers,
            )
        except Exception as e:  # raised below, once every rank knows
            error = e
        failed = torch.tensor([float(error is not None)], device=self.dist.device)
        parallel.all_reduce_sum(failed, self.dist)
        if error is not None:
            raise error
        if failed.item() > 0:
            raise UserError(
                "the metrics log or a tracker could not start on rank 0",
                fix="read rank 0's message above",
            )
        return log

    def _log_when_due(self, out: dict, window: _Window, log: MetricsLog) -> dict | None:
        """Log the window (and validate) when due; the validation results when it ran."""
        settings, step, total = self.settings, self.state.step, self.schedule.total_steps
        if _due(step, settings.log_every) or step == total:
            record = self._record(out, window.loss, window.parts, window.tokens, window.start)
            evaluated = None
            if _due(step, settings.eval_every) or step == total:
                evaluated = self.evaluate()
                record.update(evaluated)
            log.log(record)
            self.state.history.append(record)
            window.reset()
            return evaluated
        if _due(step, settings.eval_every):
            evaluated = self.evaluate()
            log.log({"step": step, **evaluated})
            return evaluated
        return None

    def _save_when_due(self, flags: dict[str, bool]) -> None:
        step, total = self.state.step, self.schedule.total_steps
        if step == total:
            self.save(sync=True)
            if _step_of_latest(self.checkpoints.root) != total:
                raise CheckpointError(
                    f"the final checkpoint (step {total}) could not be written to "
                    f"{self.checkpoints.root}",
                    fix="fix the disk and rerun the same command: it resumes from "
                    f"{checkpoint_layout.latest(self.checkpoints.root) or 'the start'}",
                )
        elif _due(step, self.settings.checkpoint_every) or flags["retry"] or flags["minutes"]:
            self.save()

    def _step_flags(self, out: dict, *, final: bool) -> dict[str, bool]:
        """One small all-reduce per step, on the checkpoint control group: ranks agree on
        preemption, on whether the save in flight is written everywhere, on the clocks, and on
        which steps had a non-finite loss or gradient norm: the previous step (read now that
        this one is queued, so the host does not stall the device) and, at the last step, this
        one too (its final checkpoint waits for the device anyway)."""
        pending, retry = self.checkpoints.local_flags()
        minutes = self.every_minutes > 0 and (
            time.monotonic() - self._last_save >= 60 * self.every_minutes
        )
        health = _Readback(torch.stack([out["loss_sum"].float(), out["grad_norm"].float()]))
        unread = [self._unread_health] if self._unread_health is not None else []
        if final:
            unread.append((self.state.step, health))
            self._unread_health = None
        else:
            self._unread_health = (self.state.step, health)
        read = [(step, values.tolist()) for step, values in unread]
        nonfinite = [float(not all(map(math.isfinite, values))) for _, values in read]
        preempt = float(self.preemption.received is not None)
        flags = torch.tensor([preempt, pending, retry, float(minutes), *nonfinite])
        if self.dist.distributed:
            torch.distributed.all_reduce(
                flags, op=torch.distributed.ReduceOp.MAX, group=self.checkpoints.group
            )
        preempt, pending, retry, minutes, *nonfinite = (bool(v) for v in flags.tolist())
        for (step, (loss, grad_norm)), bad in zip(read, nonfinite, strict=True):
            self._nonfinite.add(step, bad, loss, grad_norm)
        if self._nonfinite.count >= self.settings.max_nonfinite_steps:
            self._stop_diverged()
        return {"preempt": preempt, "pending": pending, "retry": retry, "minutes": minutes}

    def _stop_diverged(self) -> None:
        """Stop (every rank at once) after too many non-finite steps in a row. A save still in
        flight is committed when it was taken before them, else abandoned."""
        run, keys = self._nonfinite, self.settings.optimizer_keys
        in_flight = self.checkpoints.in_flight_step
        if in_flight is not None and in_flight < run.first_step:
            with contextlib.suppress(CheckpointError):  # reported as a warning
                self.checkpoints.wait()
        self.checkpoints.abandon()
        latest = checkpoint_layout.latest(self.checkpoints.root)
        if latest is not None:
            kept = f"the latest committed checkpoint is {latest}"
            again = f"run again: it continues from {latest.name} (--force starts over)"
        else:
            kept = f"no checkpoint was committed in {self.checkpoints.root}"
            again = "run again: it starts from the beginning"
        last = run.first_step + run.count - 1
        steps = f"step {last}" if run.count == 1 else f"steps {run.first_step} to {last}"
        clip = f"now {self.settings.grad_clip:g}" if self.settings.grad_clip > 0 else "now off"
        precision = {"fp8": "bf16 or fp32", "fp8-emulate": "fp32", "bf16": "fp32"}.get(
            self.numerics.name
        )
        raise UserError(
            f"training diverged: {steps} had a non-finite loss or gradient norm (at step "
            f"{run.first_step} {run.detail()}); their updates were skipped and training "
            f"stopped ({keys}.max_nonfinite_steps = {self.settings.max_nonfinite_steps}); {kept}",
            fix=f"lower {keys}.lr (now {self.schedule.peak:g}), lengthen {keys}.warmup_steps (now "
            f"{self.schedule.warmup_steps}) or clip gradients harder with {keys}.grad_clip ({clip})"
            + (f", or train in precision.mode {precision}" if precision else "")
            + f"; then {again}",
        )

    def _record(
        self, out: dict, window_loss, window_parts: dict, window_tokens: int, window_start: float
    ) -> dict:
        # The one wait for the device per log line: its numbers are read here, not in the step.
        window_tokens = int(window_tokens)
        loss = parallel.all_reduce_sum(window_loss.detach().clone().double(), self.dist)
        parts = {
            name: float(parallel.all_reduce_sum(value.clone().double(), self.dist))
            / max(window_tokens, 1)
            for name, value in sorted(window_parts.items())
        }
        elapsed = max(time.perf_counter() - window_start, 1e-9)
        tokens_per_s = window_tokens / elapsed
        achieved = tokens_per_s * self.settings.flops_per_token / self.dist.world_size
        if self.dist.device.type == "cpu" and achieved > self._peak_flops:
            self._peak_flops = achieved
        mfu = achieved / self._peak_flops
        return {
            "step": self.state.step,
            "loss": float(loss) / max(window_tokens, 1),
            **parts,
            "lr": out["lr"],
            "grad_norm": float(out["grad_norm"]),
            "tokens": self.tokens(),
            "tokens_per_s": tokens_per_s,
            "mfu": mfu if math.isfinite(mfu) else None,
            "peak_memory_gb": peak_memory_gb(self.dist.device),
        }
