"""The read-ahead loader: exact resume despite batches read ahead, errors that reach the trainer,
clean shutdown; and the trainer's step: gradients divided by the global token count after the
backward equal the loss-scaled ones, with no device read in the step."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hanlm import model as model_lib
from hanlm.data.chat_data import ChatLoader
from hanlm.data.loader import TokenLoader
from hanlm.train import checkpoint_layout, parallel, precision
from hanlm.train.checkpoint_manager import CheckpointManager
from hanlm.train.optim import adamw
from hanlm.train.prefetch import IGNORE, Prefetcher
from hanlm.train.trainer import Schedule, Trainer, TrainerSettings

SEQ_LEN, VOCAB = 16, 256


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "train-00000.bin"
    np.random.default_rng(0).integers(0, VOCAB, size=40 * SEQ_LEN + 1, dtype=np.uint16).tofile(path)
    return path


def token_loader(shard: Path) -> TokenLoader:
    return TokenLoader([shard], dtype="uint16", seq_len=SEQ_LEN, micro_batch=2, seed=3)


def chat_loader(micro_batch: int = 2) -> ChatLoader:
    """Rows whose labels are partly IGNORE, as in SFT."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, size=(24, SEQ_LEN + 1))
    mask = rng.random((24, SEQ_LEN + 1)) < 0.4
    return ChatLoader(ids, mask, micro_batch=micro_batch, seed=2)


def wait_until_read_ahead(prefetcher: Prefetcher) -> None:
    deadline = time.monotonic() + 10
    while not prefetcher._queue.full():
        assert time.monotonic() < deadline, "the thread never filled its queue"
        time.sleep(0.01)


def test_resume_ignores_batches_read_ahead(shard):
    ahead = Prefetcher(token_loader(shard), torch.device("cpu"), depth=4)
    for _ in range(3):
        ahead.next_batch()
    wait_until_read_ahead(ahead)
    # The loader itself is 4 (or 5, one waiting for room) batches further on; the saved
    # position is after the third.
    assert ahead.loader.state_dict()["consumed"] >= 7 * 2
    state = ahead.state_dict()
    assert state["consumed"] == 3 * 2

    plain = token_loader(shard)
    for _ in range(3):
        plain.next_batch()
    assert plain.state_dict() == state

    resumed = Prefetcher(token_loader(shard), torch.device("cpu"), depth=4)
    resumed.load_state_dict(state)
    for _ in range(30):  # across the end of the epoch, too (20 steps per epoch)
        expected_inputs, expected_labels = plain.next_batch()
        got, same = resumed.next_batch(), ahead.next_batch()
        assert torch.equal(got.inputs, expected_inputs) and torch.equal(got.labels, expected_labels)
        assert torch.equal(same.inputs, expected_inputs)
    assert resumed.state_dict() == plain.state_dict() == ahead.state_dict()
    ahead.close()
    resumed.close()


def test_close_then_continue_rewinds_to_the_last_batch_taken(shard):
    ahead = Prefetcher(token_loader(shard), torch.device("cpu"), depth=3)
    plain = token_loader(shard)
    ahead.next_batch(), plain.next_batch()
    wait_until_read_ahead(ahead)
    ahead.close()
    assert ahead.loader.state_dict() != ahead.state_dict()  # the loader had read on
    for _ in range(4):
        assert torch.equal(ahead.next_batch().inputs, plain.next_batch()[0])
    ahead.close()


def test_token_count_comes_from_the_host_labels():
    loader = chat_loader()
    reference = chat_loader()
    ahead = Prefetcher(loader, torch.device("cpu"))
    for _ in range(5):
        batch = ahead.next_batch()
        _, labels = reference.next_batch()
        assert torch.equal(batch.labels, labels)
        assert batch.tokens.dtype == torch.int64
        assert int(batch.tokens) == int((labels != IGNORE).sum()) > 0
    ahead.close()


class _FailsOnCall:
    """A real loader whose `fail_at`-th next_batch() raises, as a corrupt shard would."""

    def __init__(self, loader, fail_at: int, error: BaseException):
        self.loader, self.fail_at, self.error, self.calls = loader, fail_at, error, 0

    def next_batch(self):
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        return self.loader.next_batch()

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)


def test_an_error_in_the_thread_reaches_the_trainer_at_its_batch(shard):
    failing = _FailsOnCall(token_loader(shard), 3, OSError(5, "Input/output error"))
    ahead = Prefetcher(failing, torch.device("cpu"), depth=4)
    ahead.next_batch(), ahead.next_batch()  # the batches before the failure are delivered
    with pytest.raises(OSError, match="Input/output error") as raised:
        ahead.next_batch()
    assert any(frame.name == "_read_one" for frame in raised.traceback)  # the thread's frames
    assert ahead._thread is None  # stopped
    with pytest.raises(RuntimeError, match="failed"):
        ahead.next_batch()


def test_a_bad_batch_shape_is_reported(shard):
    class Triples:
        def next_batch(self):
            return torch.zeros(2, 3), torch.zeros(2, 3), [1, 2]

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    with pytest.raises(TypeError, match="dict of tensors"):
        Prefetcher(Triples(), torch.device("cpu")).next_batch()


def test_extra_model_inputs_travel_with_the_batch():
    class WithPositions:
        def __init__(self):
            self.loader = chat_loader()

        def next_batch(self):
            inputs, labels = self.loader.next_batch()
            positions = torch.arange(inputs.shape[1]).expand_as(inputs)
            return inputs, labels, {"position_ids": positions}

        def state_dict(self):
            return self.loader.state_dict()

        def load_state_dict(self, state):
            self.loader.load_state_dict(state)

    batch = Prefetcher(WithPositions(), torch.device("cpu")).next_batch()
    assert set(batch.extra) == {"position_ids"}
    assert torch.equal(batch.extra["position_ids"][0], torch.arange(SEQ_LEN))


def test_close_does_not_hang_on_a_full_queue(shard):
    ahead = Prefetcher(token_loader(shard), torch.device("cpu"), depth=1)
    ahead.next_batch()
    wait_until_read_ahead(ahead)  # the thread is now blocked on a full queue
    thread = ahead._thread
    started = time.monotonic()
    ahead.close()
    assert time.monotonic() - started < 2 and not thread.is_alive()


# -- the trainer's step ------------------------------------------------------------------------


def make_trainer(tmp_path: Path, model, loader, accumulation: int, grad_clip: float) -> Trainer:
    d = parallel.Dist(0, 1, 0, torch.device("cpu"))
    return Trainer(
        model=model,
        optimizer=adamw(
            model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, device=d.device
        ),
        train_loader=loader,
        val_loader=None,
        schedule=Schedule(100, 1e-3, 0, 0.1, "cosine", 0.2),
        settings=TrainerSettings(accumulation, grad_clip, 1, 0, 1, 0, 1.0, 1.0, "test"),
        dist=d,
        mode="single",
        numerics=precision.resolve("fp32", d.device),
        metrics_path=tmp_path / "metrics.jsonl",
        checkpoints=CheckpointManager(tmp_path / "ckpt", d, checkpoint_layout.Policy()),
    )


@pytest.mark.parametrize("grad_clip", [0.0, 0.05])  # 0.05: below the norm, so it clips
def test_step_gradient_is_the_token_sum_over_the_global_count(tmp_path, grad_clip):
    config = model_lib.model_config("tiny", vocab_size=VOCAB, seq_len=SEQ_LEN)
    model = model_lib.build_model(config, seed=0)
    reference = copy.deepcopy(model)
    trainer = make_trainer(tmp_path, model, chat_loader(), accumulation=3, grad_clip=grad_clip)

    seen: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        seen.update({n: p.grad.clone() for n, p in model.named_parameters()})
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    out = trainer.train_step()

    # The loss scaled by 1 / (global count) before each backward, as the step did before.
    data = chat_loader()
    micro = [data.next_batch() for _ in range(3)]
    count = sum(int((y != IGNORE).sum()) for _, y in micro)
    for x, y in micro:
        logits = reference(input_ids=x).logits
        loss = F.cross_entropy(
            logits.view(-1, VOCAB), y.view(-1), ignore_index=IGNORE, reduction="sum"
        )
        (loss / count).backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), grad_clip or float("inf"))
    assert float(out["grad_norm"]) == pytest.approx(float(norm), rel=1e-5)
    if grad_clip:
        assert float(norm) > grad_clip  # the clip is really applied
    for name, param in reference.named_parameters():
        # equal up to fp32 rounding: the division now follows the sum instead of preceding it
        scale = float(param.grad.abs().max())
        torch.testing.assert_close(seen[name], param.grad, rtol=1e-5, atol=1e-5 * scale)
    assert int(out["tokens"]) == count
    assert trainer.tokens() == count  # read lazily, once
    trainer.train_loader.close()
