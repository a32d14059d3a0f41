"""`hanlm plan`: the data stages' wall time (hanlm.plan.data_rates): it scales with the corpus
and the cores, local files are sized, the field recipe gives hours on a ~100 GB corpus, and bad
values are refused."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import assert_user_error
from hanlm.config import load_config
from hanlm.plan import data_rates as dr
from hanlm.plan import recipe

DOC = {"text": "한국어 문서입니다. 서울은 대한민국의 수도이다. " * 20}


def work(gb: float = 10.0, cores: int = 1, near_dedup: bool = True, decontam: bool = True):
    return dr.DataWork(gb * dr.GB, "given", False, cores, "given", near_dedup, decontam)


def test_time_is_size_over_rate_on_one_core():
    t = dr.data_time(work(gb=3.6, near_dedup=False))
    for stage, key in (("corpus", "corpus"), ("decontam", "decontam"), ("shards", "shards")):
        rate = dr.DATA_RATES[key].mb_per_s_per_core
        assert t["stages"][stage]["hours"] == pytest.approx(3600 / rate / 3600)
    assert t["total_hours"] == pytest.approx(sum(s["hours"] for s in t["stages"].values()))


def test_time_scales_with_size_and_cores():
    base = dr.data_time(work(gb=10, cores=1))
    double = dr.data_time(work(gb=20, cores=1))
    assert double["total_hours"] == pytest.approx(2 * base["total_hours"])
    many = dr.data_time(work(gb=10, cores=32))
    expected = 1 + dr.SCALING_EFFICIENCY * 31
    assert many["effective_cores"] == pytest.approx(expected)
    assert many["total_hours"] == pytest.approx(base["total_hours"] / expected)
    assert many["total_hours"] < dr.data_time(work(gb=10, cores=8))["total_hours"]


def test_near_dedup_and_decontam_as_configured():
    with_nd = dr.data_time(work(near_dedup=True))["stages"]["corpus"]
    without = dr.data_time(work(near_dedup=False))["stages"]["corpus"]
    assert with_nd["rate"] == "corpus_near_dedup" and without["rate"] == "corpus"
    assert with_nd["hours"] > without["hours"]
    skipped = dr.data_time(work(decontam=False))
    assert "skipped" in skipped["stages"]["decontam"]
    assert skipped["total_hours"] < dr.data_time(work())["total_hours"]


def test_local_files_are_sized(tmp_path):
    line = (json.dumps(DOC, ensure_ascii=False) + "\n").encode()
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(line * 100)
    size, how, estimated, _ = dr.corpus_size([str(tmp_path / "*.jsonl")], "text", tokens=None)
    assert size == plain.stat().st_size and not estimated and "1 local files" in how

    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(line * 1000))
    size, how, estimated, _ = dr.corpus_size([str(packed)], "text", tokens=None)
    assert size == pytest.approx(packed.stat().st_size * dr.COMPRESSION_RATIO)
    assert estimated and "compressed" in how

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = [f"{i}번째 {DOC['text']}" for i in range(500)]  # distinct: no dictionary encoding
    pq.write_table(pa.table({"text": texts, "id": list(range(500))}), tmp_path / "c.parquet")
    size, _, estimated, _ = dr.corpus_size([str(tmp_path / "c.parquet")], "text", tokens=None)
    text_bytes = sum(len(t.encode()) for t in texts)
    # the footer's uncompressed size of the text column: the text plus a length per value
    assert text_bytes <= size < text_bytes * 1.1 and not estimated
    assert (tmp_path / "c.parquet").stat().st_size < text_bytes  # compressed on disk


def test_each_input_format_is_read_at_its_own_rate(tmp_path):
    """Parquet and JSONL have a corpus rate each, measured on the same documents
    (benchmarks/corpus_formats.py): a corpus of both takes the seconds of each part."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = [f"{i}번째 {DOC['text']}" for i in range(500)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "web.parquet")
    (tmp_path / "forum.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    )
    inputs = [str(tmp_path / "web.parquet"), str(tmp_path / "forum.jsonl")]
    sized = dr.corpus_size(inputs, "text", tokens=None)
    parquet = dr.corpus_size(inputs[:1], "text", tokens=None).bytes
    assert sized.parquet_bytes == parquet and sized.bytes > parquet
    for key in ("corpus", "corpus_near_dedup", "corpus_near_dedup_quality"):
        assert dr.DATA_RATES[key + dr.PARQUET].measured_by.startswith("benchmarks/corpus_formats")
    mixed = dr.DataWork(sized.bytes, "given", False, 1, "given", True, True,
                        parquet_bytes=sized.parquet_bytes)  # fmt: skip
    corpus = dr.data_time(mixed)["stages"]["corpus"]
    text_rate = dr.DATA_RATES["corpus_near_dedup"].mb_per_s_per_core
    parquet_rate = dr.DATA_RATES["corpus_near_dedup_parquet"].mb_per_s_per_core
    seconds = (sized.bytes - parquet) / dr.MB / text_rate + parquet / dr.MB / parquet_rate
    assert corpus["hours"] == pytest.approx(seconds / 3600)
    assert corpus["parquet_share"] == pytest.approx(parquet / sized.bytes)
    # a recipe's sources: what the plan sizes carries the parquet part through
    cfg = load_config(values={"corpus.inputs": inputs, "corpus.near_dedup": True})
    assert dr.data_work(cfg, tokens=None).parquet_bytes == pytest.approx(parquet)


def test_missing_local_files_and_hf_inputs(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 5000)
    inputs = [str(tmp_path / "*.txt"), str(tmp_path / "later/*.jsonl"), "hf:someone/ko:train"]
    size, how, estimated, _ = dr.corpus_size(inputs, "text", tokens=1e6)
    assert size == pytest.approx(1e6 * dr.CHARS_PER_TOKEN * dr.BYTES_PER_CHAR) and estimated
    assert "not there yet" in how and "later" in how and "the rest of" in how
    # local files larger than the token target's text: the files count
    size, _, _, _ = dr.corpus_size(inputs, "text", tokens=10)
    assert size == 5000
    # no files, no tokens: nothing to size from
    assert dr.corpus_size(["hf:someone/ko:train"], "text", tokens=None) is None
    assert dr.corpus_size(["hf:someone/ko:train"], "text", tokens=None, corpus_gb=2) == (
        2e9,
        "plan.corpus_gb",
        False,
        0.0,
    )
    size, how, _, _ = dr.corpus_size(["demo"], "text", tokens=None, demo_mb=4)
    assert size == 4e6 and "demo" in how


def test_cores_from_plan_engine_or_machine(monkeypatch):
    monkeypatch.setattr(dr.os, "cpu_count", lambda: 12)
    cfg = load_config(values={"plan.data_cores": 64, "data_engine.workers": 8})
    assert dr.data_cores(cfg.plan.data_cores, cfg.data_engine) == (64, "plan.data_cores")
    cfg = load_config(values={"data_engine.workers": 8})
    assert dr.data_cores(0, cfg.data_engine) == (8, "data_engine.workers")
    cfg = load_config()
    assert dr.data_cores(0, cfg.data_engine) == (12, "this machine's")
    cfg = load_config(values={"data_engine.executor": "ray"})
    cores, why = dr.data_cores(0, cfg.data_engine)
    assert cores == 12 and "plan.data_cores" in why


def test_field_recipe_hours_on_a_hundred_gigabyte_corpus():
    cfg = load_config("ko-1.3b-8x5090")
    assert cfg.corpus.near_dedup and all(s.startswith("hf:") for s in cfg.corpus.all_inputs())
    setup = recipe.setup_from_config(cfg)
    assert setup.data is not None and setup.data.cores == 32
    t = dr.data_time(setup.data)
    assert 80 <= t["corpus_gb"] <= 200 and t["size_estimated"]
    assert t["stages"]["corpus"]["rate"] == "corpus_near_dedup_quality"  # the recipe filters
    assert 0.2 <= t["total_hours"] <= 24  # hours, not days, on the 32 cores of the rented host
    on_8 = dr.data_time(recipe.setup_from_config(load_config(
        "ko-1.3b-8x5090", values={"plan.data_cores": 8}
    )).data)  # fmt: skip
    assert on_8["total_hours"] > 3 * t["total_hours"]


def test_cli_plan_shows_the_data_stages(cli):
    result = cli("plan", "--config", "ko-1.3b-8x5090", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)["data"]
    assert set(data["stages"]) == {"corpus", "decontam", "shards"}
    assert data["cores"] == 32 and data["cores_basis"] == "plan.data_cores"
    result = cli("plan", "--config", "ko-1.3b-8x5090", "--corpus-gb", "10", "--data-cores", "4")
    assert result.code == 0, result.err
    err = " ".join(result.err.split())
    assert "data stages: 10.0 GB on 4 cores" in err
    assert "plan.corpus_gb" in err and "data_rates.py" in err and "4 (plan.data_cores)" in err


def test_cli_plan_without_corpus_size_says_what_to_set(cli):
    result = cli("plan", "--preset", "tiny", "--set", 'corpus.inputs=["hf:someone/ko:train"]')
    assert result.code == 0, result.err
    assert "--corpus-gb" in " ".join(result.err.split())


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--data-cores", "-1"], "plan.data_cores"),
        (["--corpus-gb", "-5"], "plan.corpus_gb"),
        (["--corpus-gb", "nan"], "plan.corpus_gb"),
    ],
)
def test_cli_bad_data_values(cli, args, needle):
    assert_user_error(cli("plan", *args), needle)


def test_cli_data_cores_not_a_number(cli, capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own check of the flag's type: exit 2
        cli("plan", "--data-cores", "two")
    assert e.value.code == 2 and "--data-cores: invalid int value" in capsys.readouterr().err


def test_a_local_snapshot_is_sized_from_its_splits_parquet_footers(tmp_path):
    """hf:FOLDER:CONFIG:SPLIT names a downloaded snapshot: the plan sizes that split's files
    (the text column's uncompressed bytes), not the whole folder, and a split that is not there
    is listed as missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "ds"
    for split, n in (("train", 400), ("test", 40)):
        (root / split).mkdir(parents=True)
        table = pa.table({"text": [f"한국어 문서 {i}번입니다 " * 20 for i in range(n)]})
        pq.write_table(table, root / split / "0000.parquet")
    train = dr.inputs_bytes([f"hf:{root}:train"], "text")
    test = dr.inputs_bytes([f"hf:{root}:test"], "text")
    assert train["files"] == 1 and train["remote"] == [] and train["bytes"] > 9 * test["bytes"] > 0
    assert dr.inputs_bytes([f"hf:{root}:validation"], "text")["missing"] == [
        f"hf:{root}:validation"]  # fmt: skip
    assert dr.inputs_bytes(["hf:someone/ko:train"], "text")["remote"] == ["hf:someone/ko:train"]
