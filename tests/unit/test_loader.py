"""TokenLoader: sample layout, global order, exact resume across world sizes, and user errors.

The synthetic shards hold token value `FILE_BASE * file + position`, so the first input token of
a sample names its file and offset, and a window crossing a file boundary would show a jump.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hanlm.data.loader import TokenLoader
from hanlm.errors import UserError

SEQ_LEN = 8
FILE_BASE = 10_000
UINT32_OFFSET = 100_000  # above the uint16 range, so uint32 files prove they are read as uint32
TRAIN_LENGTHS = (97, 9, 3, 50, 161)  # 12, 1, 0, 6, 20 samples of SEQ_LEN + 1 tokens
VAL_LENGTHS = (41, 33)  # 5, 4 samples
TOKENIZER_SHA = "ab12cd34"


def token_values(file_index: int, length: int, dtype: str) -> np.ndarray:
    offset = UINT32_OFFSET if dtype == "uint32" else 0
    return (offset + FILE_BASE * file_index + np.arange(length)).astype(dtype)


def write_split(shards_dir: Path, split: str, lengths: tuple[int, ...], dtype: str) -> dict:
    entries = []
    for i, length in enumerate(lengths):
        name = f"{split}-{i:05d}.bin"
        token_values(i, length, dtype).tofile(shards_dir / name)
        entries.append({"path": name, "source": "corpus", "tokens": length, "documents": 1})
    return {"files": entries, "tokens": sum(lengths), "documents": len(lengths)}


def write_shards(shards_dir: Path, dtype: str = "uint16") -> Path:
    shards_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": 2,
        "dtype": dtype,
        "vocab_size": 4096,
        "tokenizer_sha256": TOKENIZER_SHA,
        "eod_id": 1,
        "splits": {
            "train": write_split(shards_dir, "train", TRAIN_LENGTHS, dtype),
            "val": write_split(shards_dir, "val", VAL_LENGTHS, dtype),
        },
        "special_token_counts": {"<|eot|>": 0},
    }
    (shards_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return shards_dir


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    return write_shards(tmp_path / "shards")


def make(shards_dir: Path, **kwargs) -> TokenLoader:
    kwargs.setdefault("seq_len", SEQ_LEN)
    kwargs.setdefault("micro_batch", 4)
    return TokenLoader.from_shards(shards_dir, **kwargs)


def all_sample_starts(lengths: tuple[int, ...], dtype: str = "uint16") -> list[int]:
    """First token value of every sample, in file order."""
    starts = []
    for i, length in enumerate(lengths):
        values = token_values(i, length, dtype)
        starts += [int(values[k * SEQ_LEN]) for k in range((length - 1) // SEQ_LEN)]
    return starts


def sample_starts(batches) -> list[int]:
    return [int(v) for inputs, _ in batches for v in inputs[:, 0]]


def take(loader: TokenLoader, steps: int) -> list[int]:
    return sample_starts(loader.next_batch() for _ in range(steps))


def take_world(loaders: list[TokenLoader], steps: int) -> list[int]:
    """Samples of `steps` global steps over all ranks, in global order (rank 0's part first)."""
    starts = []
    for _ in range(steps):
        for loader in loaders:
            starts += take(loader, 1)
    return starts


# ---- samples -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_batches_have_shape_dtype_and_labels_shifted_by_one(tmp_path: Path, dtype: str):
    loader = make(write_shards(tmp_path, dtype), micro_batch=3)
    for _ in range(10):
        inputs, labels = loader.next_batch()
        assert inputs.shape == labels.shape == (3, SEQ_LEN)
        assert inputs.dtype == labels.dtype == torch.int64
        assert torch.equal(labels[:, :-1], inputs[:, 1:])
        # Consecutive values everywhere: the window lies inside one file, labels = inputs + 1.
        assert torch.equal(labels, inputs + 1)
        assert set(inputs[:, 0].tolist()) <= set(all_sample_starts(TRAIN_LENGTHS, dtype))


def test_sample_counts_follow_whole_windows_per_file(shards: Path):
    loader = make(shards)
    assert loader.samples_per_epoch == sum((n - 1) // SEQ_LEN for n in TRAIN_LENGTHS) == 39
    assert loader.steps_per_epoch == 39 // 4
    assert loader.tokens_per_step == 4 * SEQ_LEN
    assert make(shards, micro_batch=2, world_size=3).tokens_per_step == 6 * SEQ_LEN


def test_unshuffled_order_is_file_order(shards: Path):
    loader = make(shards, shuffle=False, micro_batch=1)
    assert take(loader, 39) == all_sample_starts(TRAIN_LENGTHS)


def test_validation_split_is_unshuffled_by_default(shards: Path):
    loader = make(shards, split="val", micro_batch=1)
    assert take(loader, 9) == all_sample_starts(VAL_LENGTHS)


def test_order_is_deterministic_per_seed(shards: Path):
    first = take(make(shards, seed=1), 9)
    assert first == take(make(shards, seed=1), 9)
    assert first != take(make(shards, seed=2), 9)
    assert first != all_sample_starts(TRAIN_LENGTHS)[:36]


def test_epoch_covers_every_sample_once_except_dropped_remainder(shards: Path):
    loader = make(shards, micro_batch=5)
    epoch = take(loader, loader.steps_per_epoch)
    assert len(epoch) == 35 == len(set(epoch))
    assert set(epoch) < set(all_sample_starts(TRAIN_LENGTHS))
    assert loader.state_dict()["epoch"] == 0


def test_epoch_rolls_over_to_a_new_order(shards: Path):
    loader = make(shards, micro_batch=5)
    first = take(loader, loader.steps_per_epoch)
    assert loader.state_dict()["consumed"] == 35
    second = take(loader, loader.steps_per_epoch)
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 35)
    assert len(set(second)) == 35
    assert second != first
    take(loader, 1)
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (2, 5)


def test_iter_yields_next_batches(shards: Path):
    stream = iter(make(shards, seed=3))
    batches = [next(stream) for _ in range(5)]
    assert sample_starts(batches) == take(make(shards, seed=3), 5)


def test_pin_memory_flag_is_harmless_without_cuda(shards: Path):
    inputs, _ = make(shards, pin_memory=True).next_batch()
    assert inputs.shape == (4, SEQ_LEN)


# ---- ranks and resume ----------------------------------------------------------------------


def test_ranks_split_each_global_step_in_order(shards: Path):
    single = make(shards, micro_batch=4, seed=5)
    pair = [make(shards, micro_batch=2, rank=r, world_size=2, seed=5) for r in (0, 1)]
    for _ in range(12):  # crosses the end of epoch 0
        whole = take(single, 1)
        assert take(pair[0], 1) == whole[:2]
        assert take(pair[1], 1) == whole[2:]
        assert pair[0].state_dict() == pair[1].state_dict() == single.state_dict()


@pytest.mark.parametrize("steps_before_save", [0, 3, 9, 10, 14])
def test_resume_continues_exactly(shards: Path, steps_before_save: int):
    uninterrupted = make(shards, seed=7)
    expected = take(uninterrupted, steps_before_save + 12)

    first = make(shards, seed=7)
    before = take(first, steps_before_save)
    state = json.loads(json.dumps(first.state_dict()))  # as if saved to disk
    resumed = make(shards, seed=7)
    resumed.load_state_dict(state)
    assert before + take(resumed, 12) == expected


def test_resume_across_one_two_one_ranks_skips_and_repeats_nothing(shards: Path):
    uninterrupted = take(make(shards, micro_batch=4, seed=11), 3 + 10 + 4)

    world1 = make(shards, micro_batch=4, seed=11)
    seen = take(world1, 3)
    state = world1.state_dict()

    world2 = [make(shards, micro_batch=2, rank=r, world_size=2, seed=11) for r in (0, 1)]
    for loader in world2:
        loader.load_state_dict(state)
    seen += take_world(world2, 10)  # crosses the end of epoch 0
    state = world2[0].state_dict()
    assert world2[1].state_dict() == state
    assert state["epoch"] == 1

    world1_again = make(shards, micro_batch=4, seed=11)
    world1_again.load_state_dict(state)
    seen += take(world1_again, 4)
    assert seen == uninterrupted


def test_resume_with_another_step_size_continues_at_consumed(shards: Path):
    order = take(make(shards, micro_batch=1, seed=13), 39)  # epoch 0, one sample per step

    three = make(shards, micro_batch=3, seed=13)
    seen = take(three, 2)
    pair = [make(shards, micro_batch=2, rank=r, world_size=2, seed=13) for r in (0, 1)]
    for loader in pair:
        loader.load_state_dict(three.state_dict())
    seen += take_world(pair, 8)  # 6 + 32 = 38 samples; 1 is left, less than a step of 4
    assert seen == order[:38]

    take_world(pair, 1)  # drops the last sample and starts epoch 1
    assert pair[0].state_dict()["epoch"] == 1


def test_state_after_last_full_step_lets_a_smaller_step_use_the_tail(shards: Path):
    order = take(make(shards, micro_batch=1, seed=17), 39)
    big = make(shards, micro_batch=6, seed=17)
    seen = take(big, big.steps_per_epoch)  # 36 samples; 3 left, fewer than 6
    small = make(shards, micro_batch=3, seed=17)
    small.load_state_dict(big.state_dict())
    seen += take(small, 1)
    assert seen == order
    assert small.state_dict()["epoch"] == 0


# ---- evaluation ------------------------------------------------------------------------------


def test_eval_batches_are_deterministic_and_leave_training_state_alone(shards: Path):
    loader = make(shards, seed=19)
    reference = make(shards, seed=19)
    assert take(loader, 3) == take(reference, 3)
    state = loader.state_dict()

    first = sample_starts(loader.eval_batches())
    assert first == sample_starts(loader.eval_batches())
    assert first == all_sample_starts(TRAIN_LENGTHS)[:36]  # unshuffled, remainder left out
    assert loader.state_dict() == state
    assert take(loader, 5) == take(reference, 5)


def test_eval_batches_slice_by_rank_and_respect_max_batches(shards: Path):
    val = all_sample_starts(VAL_LENGTHS)
    ranks = [make(shards, split="val", micro_batch=2, rank=r, world_size=2) for r in (0, 1)]
    per_rank = [list(loader.eval_batches()) for loader in ranks]
    assert len(per_rank[0]) == len(per_rank[1]) == 2
    assert sample_starts(per_rank[0]) == val[0:2] + val[4:6]
    assert sample_starts(per_rank[1]) == val[2:4] + val[6:8]
    assert len(list(ranks[0].eval_batches(max_batches=1))) == 1
    assert list(ranks[0].eval_batches(max_batches=0)) == []


# ---- user errors -----------------------------------------------------------------------------


def test_missing_manifest(tmp_path: Path):
    with pytest.raises(UserError, match="hanlm shards"):
        make(tmp_path)


def test_unreadable_manifest(shards: Path):
    (shards / "manifest.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="cannot be read"):
        make(shards)


def test_wrong_tokenizer(shards: Path):
    make(shards, expected_tokenizer_sha256=TOKENIZER_SHA)
    with pytest.raises(UserError, match=r"another tokenizer.*hanlm shards --force"):
        make(shards, expected_tokenizer_sha256="ffff")


def test_unknown_split(shards: Path):
    with pytest.raises(UserError, match=r"no split 'test'.*\['train', 'val'\]"):
        make(shards, split="test")


def test_empty_split(shards: Path):
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["splits"]["val"]["files"] = []
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="holds no tokens"):
        make(shards, split="val")


def test_missing_shard_file(shards: Path):
    (shards / "train-00003.bin").unlink()
    with pytest.raises(UserError, match="missing") as info:
        make(shards)
    assert "train-00003.bin" in str(info.value)


@pytest.mark.parametrize("resize", [lambda data: data[:-2], lambda data: data + data[:4]])
def test_shard_file_of_wrong_size(shards: Path, resize):
    path = shards / "train-00004.bin"
    path.write_bytes(resize(path.read_bytes()))
    with pytest.raises(UserError, match="truncated") as info:
        make(shards)
    assert "train-00004.bin" in str(info.value)


def test_too_little_data(shards: Path):
    make(shards, split="val", micro_batch=9)
    with pytest.raises(UserError, match=r"74 tokens.*needs .* 10 samples.*smaller seq_len"):
        make(shards, split="val", micro_batch=10)
    with pytest.raises(UserError, match="step needs"):
        make(shards, split="val", micro_batch=3, world_size=4)


@pytest.mark.parametrize(
    ("argument", "value"),
    [("rank", 2), ("rank", -1), ("seq_len", 0), ("micro_batch", 0), ("seed", -1)],
)
def test_bad_arguments(shards: Path, argument: str, value: int):
    with pytest.raises(UserError, match=argument):
        make(shards, world_size=2, **{argument: value})


def test_constructor_checks_files_and_dtype(shards: Path):
    with pytest.raises(UserError, match="not found"):
        TokenLoader([shards / "nope.bin"], dtype="uint16", seq_len=SEQ_LEN, micro_batch=1)
    with pytest.raises(UserError, match="whole number"):
        # 97 uint16 tokens are 194 bytes, not a multiple of 4
        TokenLoader([shards / "train-00000.bin"], dtype="uint32", seq_len=4, micro_batch=1)
    with pytest.raises(UserError, match="not supported"):
        TokenLoader([shards / "train-00000.bin"], dtype="int8", seq_len=4, micro_batch=1)


def good_state(shards: Path) -> dict:
    loader = make(shards)
    take(loader, 2)
    return loader.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"consumed": None}, "lacks the keys"),
        ({"version": 2}, "version"),
        ({"consumed": -4}, "consumed must be"),
        ({"epoch": 1.5}, "epoch must be"),
        ({"seed": True}, "seed must be"),
        ({"fingerprint": 123}, "fingerprint"),
        ({"consumed": 40}, "only 39"),
    ],
)
def test_malformed_state(shards: Path, change: dict, message: str):
    state = good_state(shards)
    for key, value in change.items():
        if value is None:
            del state[key]
        else:
            state[key] = value
    loader = make(shards)
    with pytest.raises(UserError, match=message):
        loader.load_state_dict(state)
    assert loader.state_dict()["consumed"] == 0


def test_state_is_not_a_mapping(shards: Path):
    with pytest.raises(UserError, match="mapping"):
        make(shards).load_state_dict([1, 2])


@pytest.mark.parametrize(
    "other",
    [{"seq_len": SEQ_LEN + 1}, {"shuffle": False}, {"split": "val"}],
)
def test_fingerprint_mismatch(shards: Path, other: dict):
    state = good_state(shards)
    with pytest.raises(UserError, match="data or seq_len changed"):
        make(shards, **other).load_state_dict(state)


def test_changed_shard_contents_change_the_fingerprint(shards: Path):
    state = good_state(shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["splits"]["train"]["files"][0]["tokens"] = 89
    (shards / "manifest.json").write_text(json.dumps(manifest))
    path = shards / "train-00000.bin"
    path.write_bytes(path.read_bytes()[: 89 * 2])
    with pytest.raises(UserError, match="changed since the checkpoint"):
        make(shards).load_state_dict(state)


def test_seed_mismatch(shards: Path):
    state = good_state(shards)
    with pytest.raises(UserError, match=r"seed 0.*uses 1"):
        make(shards, seed=1).load_state_dict(state)


def test_fingerprint_ignores_world_size_and_micro_batch(shards: Path):
    fingerprints = {
        make(shards, micro_batch=m, rank=0, world_size=w).fingerprint
        for m, w in [(1, 1), (4, 1), (2, 3)]
    }
    assert len(fingerprints) == 1
