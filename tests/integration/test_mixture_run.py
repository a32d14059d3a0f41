"""A recipe with three corpus sources of very different sizes, from raw files to the order
training reads: per-source cleaning counts and duplicates, per-source shards (the same with 1
and 2 workers), the mix realised within 0.5% of the weights, resume, and the mixes refused."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from hanlm.config import load_config
from hanlm.data import mixture
from hanlm.data.corpus import CorpusStats
from hanlm.data.loader import TokenLoader
from hanlm.data.shards import ShardsManifest
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config

WORDS = [
    "서울",
    "부산",
    "대구",
    "인천",
    "광주",
    "대전",
    "울산",
    "한국",
    "역사",
    "문화",
    "과학",
    "음식",
    "바다",
    "산",
    "강",
    "학교",
    "도서관",
    "시장",
    "기차",
    "버스",
    "사람",
    "친구",
    "가족",
    "이야기",
    "노래",
    "그림",
    "여름",
    "겨울",
    "봄",
    "가을",
    "아침",
    "저녁",
    "공원",
    "병원",
    "회사",
]
SIZES = {"big": 700, "mid": 120, "small": 30}  # documents
RECIPE = """
[corpus]
min_chars = 20
near_dedup = true
part_chars = 30000
[[corpus.sources]]
name = "big"
inputs = ["{root}/big.jsonl"]
weight = 0.6
[[corpus.sources]]
name = "mid"
inputs = ["{root}/mid.jsonl"]
weight = 0.3
[[corpus.sources]]
name = "small"
inputs = ["{root}/small.jsonl"]
weight = 0.1
max_epochs = 100
min_chars = 60
[tokenizer]
vocab_size = 512
[data_engine]
workers = 2
[shards]
val_fraction = 0.02
[pretrain]
seq_len = 32
micro_batch = 4
global_batch_tokens = 256
max_steps = 60
"""


def document(rng: random.Random, name: str, i: int) -> str:
    sentences = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."
        for _ in range(rng.randint(3, 8))
    ]
    return f"{name} {i}번 글. " + " ".join(sentences)


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mix")
    rng = random.Random(0)
    texts = {}
    for name, n in SIZES.items():
        texts[name] = [document(rng, name, i) for i in range(n)]
    texts["mid"][7] = texts["big"][3]  # a copy of a big document: big keeps it
    texts["small"][0] = "짧은 글입니다. 너무 짧아요."  # under small's own min_chars (60)
    for name, docs in texts.items():
        with open(root / f"{name}.jsonl", "w") as f:
            for i, text in enumerate(docs):
                f.write(json.dumps({"id": f"{name}-{i}", "text": text}, ensure_ascii=False) + "\n")
    (root / "mix.toml").write_text(RECIPE.format(root=root))
    cfg = load_config(root / "mix.toml")
    for stage in ("corpus", "tokenizer", "shards"):  # (no plan or preflight: not tested here)
        run_stage(stage, cfg, root / "run")
    return root / "run"


def test_the_corpus_counts_each_source_and_says_which_source_kept_a_duplicate(mix_run):
    stats = CorpusStats.read(mix_run / "corpus" / CorpusStats.FILE)
    assert list(stats.sources) == ["big", "mid", "small"]
    assert stats.sources["mid"].exact_duplicates == 1
    assert stats.sources["mid"].duplicates_kept_by == {"big": 1}
    assert stats.sources["big"].duplicates_kept_by == {}
    assert stats.sources["small"].too_short >= 1 and stats.sources["big"].too_short == 0
    assert sum(s.documents_out for s in stats.sources.values()) == stats.documents_out
    sources = [p["source"] for p in stats.parts]
    assert sources == sorted(sources, key=["big", "mid", "small"].index)  # source after source
    assert set(sources) == {"big", "mid", "small"}


def test_every_source_has_shards_of_its_own_and_validation(mix_run):
    manifest = ShardsManifest.read(mix_run / "shards" / ShardsManifest.FILE)
    assert list(manifest.sources) == ["big", "mid", "small"]
    for name, counts in manifest.sources.items():
        assert counts.val_documents >= 1 and counts.train_tokens > 0, name
        files = [f for f in manifest.splits["train"].files if f.source == name]
        assert sum(f.tokens for f in files) == counts.train_tokens
    sizes = [manifest.sources[n].train_tokens for n in ("big", "mid", "small")]
    assert sizes[0] > 4 * sizes[1] > 4 * 4 * sizes[2]  # very different sizes


def test_one_and_two_workers_give_byte_identical_mixed_shards(mix_run, tmp_path):
    other = tmp_path / "one"
    shutil.copytree(mix_run, other)
    run_stage(
        "shards", load_run_config(other, values={"data_engine.workers": 1}), other, force=True
    )
    for path in sorted((mix_run / "shards").glob("*-*.bin")):
        assert (other / "shards" / path.name).read_bytes() == path.read_bytes(), path.name
    one, two = (ShardsManifest.read(r / "shards" / ShardsManifest.FILE) for r in (other, mix_run))
    assert one.model_dump(exclude={"seconds", "workers"}) == two.model_dump(
        exclude={"seconds", "workers"}
    )


def loader(run: Path, cfg, *, rank=0, world_size=1, micro_batch=4) -> TokenLoader:
    return TokenLoader.from_shards(
        run / "shards", "train", seq_len=cfg.pretrain.seq_len, micro_batch=micro_batch,
        rank=rank, world_size=world_size, seed=cfg.run.seed,
        mixture=mixture.for_training(cfg, run / "shards"),
    )  # fmt: skip


def test_training_reads_the_weights_within_half_a_percent_and_resumes_exactly(mix_run):
    cfg = load_run_config(mix_run)
    one = loader(mix_run, cfg)
    steps = one.steps_per_epoch
    assert one.samples_per_epoch == 60 * 256 // 32  # the budget: steps x batch / seq_len
    drawn = np.concatenate([one._take_step() for _ in range(steps)])
    realised = np.bincount(one.sample_sources(drawn), minlength=3) / len(drawn)
    assert np.abs(realised - [0.6, 0.3, 0.1]).max() < 0.005, realised
    assert one.mixture.sources[2].epochs > 1  # the small source is repeated to its share
    # stopped after 5 steps and resumed on two ranks of half the micro-batch: the same windows
    first = loader(mix_run, cfg)
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    resumed = [loader(mix_run, cfg, rank=r, world_size=2, micro_batch=2) for r in (0, 1)]
    uninterrupted = loader(mix_run, cfg)
    for _ in range(5):
        uninterrupted.next_batch()
    for r in resumed:
        r.load_state_dict(state)
    for _ in range(3):
        inputs = uninterrupted.next_batch()[0]
        halves = [r.next_batch()[0] for r in resumed]
        assert np.array_equal(inputs.numpy(), np.concatenate([h.numpy() for h in halves]))


def test_another_mix_is_another_order_and_a_checkpoint_of_the_old_one_is_refused(mix_run):
    cfg = load_run_config(mix_run)
    state = loader(mix_run, cfg).state_dict()
    other = load_run_config(mix_run, values={"pretrain.max_steps": 80})
    with pytest.raises(UserError, match="changed since the checkpoint"):
        loader(mix_run, other).load_state_dict(state)


def test_a_share_past_max_epochs_stops_pretraining_before_anything_is_written(mix_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(mix_run, run)
    cfg = load_run_config(run, values={"pretrain.max_steps": 4000})  # mid: > 4 epochs
    with pytest.raises(UserError, match=r"source 'mid' .* more than its max_epochs 4"):
        run_stage("pretrain", cfg, run)
    assert not (run / "pretrain").exists()


def test_a_source_left_empty_by_its_cleaning_is_named_before_tokenizing(mix_run, tmp_path):
    cfg = load_run_config(mix_run)
    cfg.corpus.sources[2].min_chars = 100_000
    with pytest.raises(UserError, match=r"small \(30 documents read\) have no documents"):
        run_stage("corpus", cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "corpus").exists()
