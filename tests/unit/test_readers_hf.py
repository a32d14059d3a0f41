"""Streaming `hf:` corpus inputs without the network: `datasets.load_dataset` is replaced by a
local IterableDataset (real sharding) or a stand-in that fails as the Hub would."""

from __future__ import annotations

import pytest

from hanlm.config import SourceFields
from hanlm.data import dataset_repo, readers
from hanlm.errors import UserError

datasets = pytest.importorskip("datasets")

FILES = [f"file-{i}" for i in range(4)]
ROWS_PER_FILE = 5


def _rows(files):
    for name in files:
        for k in range(ROWS_PER_FILE):
            yield {"text": f"{name} 문서 {k}", "id": f"{name}/{k}"}


@pytest.fixture
def online(monkeypatch):
    """Hugging Face set online (the test suite sets it offline), and load_dataset's calls."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    calls = []

    def use(make):
        def load_dataset(name, config=None, *, split, streaming):
            calls.append((name, config, split, streaming))
            return make()

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        return calls

    return use


def stream_of_four_files():
    # a real IterableDataset with one shard per "file", as a Hub dataset of 4 parquet files has
    return datasets.IterableDataset.from_generator(_rows, gen_kwargs={"files": FILES})


def texts(spec="hf:someone/ko:train", shard=None, skips=None):
    skips = skips or readers.Skips(strict=False)
    return [d.text for d in readers._read_hf(spec, SourceFields("text"), skips, shard=shard)]


def test_streams_with_the_name_config_and_split(online):
    calls = online(stream_of_four_files)
    docs = list(
        readers._read_hf("hf:someone/ko:sub:train", SourceFields("text"), readers.Skips(False))
    )
    assert calls == [("someone/ko", "sub", "train", True)]
    assert len(docs) == len(FILES) * ROWS_PER_FILE
    assert len({d.id for d in docs}) == len(docs)


def test_num_shards_is_the_number_of_files(online):
    online(stream_of_four_files)
    assert readers.hf_num_shards("hf:someone/ko:train") == len(FILES)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 6])
def test_shares_are_disjoint_and_complete(online, count):
    """Up to the number of files, each share is whole files; beyond, every count-th record."""
    online(stream_of_four_files)
    everything = texts()
    shares = [texts(shard=(i, count)) for i in range(count)]
    flat = [t for share in shares for t in share]
    assert sorted(flat) == sorted(everything) and len(flat) == len(set(flat))
    if count <= len(FILES):
        for share in shares:  # whole files: no file split between two shares
            files = {t.split()[0] for t in share}
            assert len(share) == len(files) * ROWS_PER_FILE


def test_share_ids_differ_between_shares(online):
    online(stream_of_four_files)
    ids = [
        d.id
        for i in range(2)
        for d in readers._read_hf(
            "hf:someone/ko:train", SourceFields("text"), readers.Skips(False), shard=(i, 2)
        )
    ]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
def test_bad_share(online, shard):
    online(stream_of_four_files)
    with pytest.raises(UserError, match="bad share"):
        texts(shard=shard)


class FakeStream:
    """What load_dataset(streaming=True) returns, as far as _read_hf uses it."""

    features = None
    num_shards = 1

    def __init__(self, records, fail_after=None):
        self.records, self.fail_after = records, fail_after

    def __iter__(self):
        for i, record in enumerate(self.records):
            if self.fail_after is not None and i == self.fail_after:
                raise ConnectionError("Connection reset by peer")
            yield record


def test_missing_text_field_is_counted(online):
    online(lambda: FakeStream([{"text": "가나다"}, {"body": "x"}, {"text": None}, {"text": "라"}]))
    skips = readers.Skips(strict=False)
    assert texts(skips=skips) == ["가나다", "라"]
    assert skips.counts["missing_field"] == 2
    with pytest.raises(UserError, match="no string field 'text'"):
        texts(skips=readers.Skips(strict=True))


def test_a_column_the_dataset_lacks_is_named(online):
    features = datasets.Features({"text": datasets.Value("string"), "id": datasets.Value("string")})
    online(
        lambda: datasets.IterableDataset.from_generator(
            _rows, gen_kwargs={"files": FILES}, features=features
        )
    )
    with pytest.raises(UserError, match="no column 'body'") as e:
        list(readers._read_hf("hf:someone/ko:train", SourceFields("body"), readers.Skips(False)))
    assert "text" in e.value.message and "--text-field" in e.value.message


def test_offline_message_names_the_download_command(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="offline") as e:
        texts("hf:HuggingFaceFW/fineweb-2:kor_Hang:train")
    msg = e.value.message
    assert (
        'hf download HuggingFaceFW/fineweb-2 --repo-type dataset --include "data/kor_Hang/train/*" '
        "--include README.md --local-dir DIR" in msg
    )
    assert "name the folder instead: hf:DIR:kor_Hang:train" in msg  # the same spelling, local
    with pytest.raises(UserError) as e:
        texts("hf:wikimedia/wikipedia:20231101.ko:train")
    assert '--include "20231101.ko/*"' in e.value.message
    assert "hf:DIR:20231101.ko:train" in e.value.message
    with pytest.raises(UserError) as e:
        texts("hf:someone/ko:train")
    assert "hf download someone/ko --repo-type dataset --local-dir DIR" in e.value.message
    assert "hf:DIR:train" in e.value.message
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")  # huggingface_hub's other spellings count too
    with pytest.raises(UserError, match="offline"):
        readers.hf_num_shards("hf:someone/ko:train")


def test_network_failure_says_how_to_download(online):
    def unreachable():
        raise ConnectionError("Couldn't reach 'someone/ko' on the Hub (ConnectionError)")

    online(unreachable)
    with pytest.raises(UserError, match="could not stream hf:someone/ko:train") as e:
        texts()
    assert "ConnectionError" in e.value.message and "hf download someone/ko" in e.value.message
    with pytest.raises(UserError, match="could not stream"):
        readers.hf_num_shards("hf:someone/ko:train")


def test_connection_lost_part_way(online):
    online(lambda: FakeStream([{"text": "가"}, {"text": "나"}], fail_after=1))
    got = []
    with pytest.raises(UserError, match="Connection reset by peer") as e:
        for doc in readers._read_hf(
            "hf:someone/ko:train", SourceFields("text"), readers.Skips(False)
        ):
            got.append(doc.text)
    assert got == ["가"] and "hf download" in e.value.message


def test_a_pinned_revision_is_streamed_recorded_and_in_the_download_command(monkeypatch):
    assert dataset_repo.hub_name_and_revision("HuggingFaceFW/fineweb-2@v2.0.1") == (
        "HuggingFaceFW/fineweb-2", "v2.0.1")  # fmt: skip
    assert dataset_repo.hub_name_and_revision("someone/ko") == ("someone/ko", None)
    spec = "hf:HuggingFaceFW/fineweb-2@v2.0.1:kor_Hang:train"
    assert dataset_repo.input_revisions([spec]) == {spec: "v2.0.1"}  # pinned: no network asked
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert dataset_repo.input_revisions(["hf:someone/ko:train"]) == {"hf:someone/ko:train": None}
    fix = dataset_repo.hf_download_fix(spec)
    assert "hf download HuggingFaceFW/fineweb-2 --repo-type dataset --revision v2.0.1" in fix
    seen = {}

    def load_dataset(name, config, **kwargs):
        seen.update(name=name, config=config, **kwargs)
        return []

    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    readers._open_hf_stream(spec)
    assert seen == {"name": "HuggingFaceFW/fineweb-2", "config": "kor_Hang", "split": "train",
                    "streaming": True, "revision": "v2.0.1"}  # fmt: skip
