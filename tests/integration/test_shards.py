import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error
from hanlm.data import shards
from hanlm.data.corpus import corpus_parts, iter_corpus, iter_part, part_sources
from hanlm.data.shards import ShardsManifest
from hanlm.data.tokenizer import TokenizerStats
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages import run_facts
from hanlm.stages.run_facts import training_corpus_dir
from hanlm.stages.rundir import load_run_config


def manifest(run_dir) -> ShardsManifest:
    return ShardsManifest.read(run_dir / "shards" / ShardsManifest.FILE)


def read_split(run_dir, split):
    m = manifest(run_dir)
    files = m.splits[split].files
    return [np.fromfile(run_dir / "shards" / f.path, dtype=m.dtype) for f in files]


def first_documents(corpus_dir) -> set[str]:
    """The first document of each corpus source: it goes to val, so each source has some."""
    firsts = {}
    for part, source in part_sources(corpus_dir).items():
        if source not in firsts:
            firsts[source] = next(iter_part(corpus_dir / part))["id"]
    return set(firsts.values())


def test_totals_equal_direct_encoding(demo_run):
    tok = run_facts.tokenizer(demo_run)
    m = manifest(demo_run)
    eod = m.eod_id
    expected = {"train": [], "val": []}
    corpus_dir = training_corpus_dir(demo_run)
    firsts = first_documents(corpus_dir)
    for doc in iter_corpus(corpus_dir):
        split = "val" if doc["id"] in firsts or shards.is_val(doc["id"], 0, 0.02) else "train"
        expected[split].extend([*tok.encode(doc["text"]).ids, eod])
    for split in ("train", "val"):
        tokens = np.concatenate(read_split(demo_run, split))
        assert tokens.tolist() == expected[split]
        assert m.splits[split].tokens == len(expected[split])
        assert m.splits[split].documents == expected[split].count(eod)
    assert m.splits["val"].documents >= 1


def test_manifest_fields(demo_run):
    m = manifest(demo_run)
    assert m.dtype == "uint16" and m.vocab_size == 1024
    sha = TokenizerStats.read(demo_run / "tokenizer" / TokenizerStats.FILE).tokenizer_sha256
    assert m.tokenizer_sha256 == sha
    counts = m.special_token_counts
    assert counts["<|endoftext|>"] == m.splits["train"].documents
    # Pretraining text never holds chat tokens: SFT must know they are untrained.
    for token in ("<|system|>", "<|user|>", "<|assistant|>", "<|eot|>", "<|pad|>"):
        assert counts[token] == 0
    for f in m.splits["train"].files:
        size = (demo_run / "shards" / f.path).stat().st_size
        assert size == f.tokens * 2


def reference_files(run_dir) -> dict[str, bytes]:
    """Every token file as the encoder before the data engine wrote it: part by part, the first
    document of each source and the seeded coin's picks to val, each document ending in EOD."""
    tok = run_facts.tokenizer(run_dir)
    m = manifest(run_dir)
    files = {}
    firsts = first_documents(training_corpus_dir(run_dir))
    for i, part in enumerate(corpus_parts(training_corpus_dir(run_dir))):
        tokens = {"train": [], "val": []}
        for doc in iter_part(part):
            val = doc["id"] in firsts or shards.is_val(doc["id"], 0, 0.02)
            tokens["val" if val else "train"].extend([*tok.encode(doc["text"]).ids, m.eod_id])
        for split, ids in tokens.items():
            files[f"{split}-{i:05d}.bin"] = np.array(ids, dtype=m.dtype).tobytes()
    return files


def token_files(run_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "shards").glob("*-*.bin"))}


def test_token_files_are_byte_identical_to_the_encoder_before_the_engine(demo_run):
    expected = reference_files(demo_run)
    assert len(expected) >= 8, "the fixture should have several parts"
    assert token_files(demo_run) == expected


def without_timing(m: ShardsManifest) -> dict:
    return m.model_dump(exclude={"seconds", "workers"})


def test_one_and_two_workers_give_identical_shards(demo_run, tmp_path):
    other = tmp_path / "one"
    shutil.copytree(demo_run, other)
    cfg = load_run_config(other, values={"data_engine.workers": 1})
    run_stage("shards", cfg, other, force=True)
    assert manifest(demo_run).workers == 2 and manifest(other).workers == 1
    assert token_files(other) == token_files(demo_run)
    assert without_timing(manifest(other)) == without_timing(manifest(demo_run))
    sidecars = sorted(p.name for p in (demo_run / "shards").glob("part-*.json"))
    for name in sidecars:
        assert (other / "shards" / name).read_text() == (demo_run / "shards" / name).read_text()
    assert not (other / "shards.work").exists()


PART_THAT_FAILS = 2


def fail_at_part(monkeypatch, index: int = PART_THAT_FAILS) -> None:
    """encode_part dies on one part after half-writing its train file, as a killed task would."""
    encode = shards.encode_part

    def dying(tok, job, counter=None):
        if job["index"] == index:
            (Path(job["out_dir"]) / f"train-{index:05d}.bin").write_bytes(b"half")
            raise RuntimeError("killed")
        return encode(tok, job, counter)

    monkeypatch.setattr(shards, "encode_part", dying)


def record_parts(monkeypatch, log: Path) -> None:
    """encode_part also appends the part it encodes to `log` (from any worker process)."""
    encode = shards.encode_part

    def recording(tok, job, counter=None):
        with open(log, "a") as f:
            f.write(f"{job['index']}\n")
        return encode(tok, job, counter)

    monkeypatch.setattr(shards, "encode_part", recording)


def encoded_parts(log: Path) -> list[int]:
    return sorted(int(line) for line in log.read_text().split()) if log.exists() else []


def killed_run(demo_run, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A copy of the demo run whose shards run died at part PART_THAT_FAILS (one worker, so
    the parts before it finished and the ones after never started), and its work folder."""
    run_dir = tmp_path / "resume"
    shutil.copytree(demo_run, run_dir)
    shutil.rmtree(run_dir / "shards")
    cfg = load_run_config(run_dir, values={"data_engine.workers": 1})
    with monkeypatch.context() as m:
        fail_at_part(m)
        with pytest.raises(RuntimeError, match="killed"):
            run_stage("shards", cfg, run_dir)
    assert not (run_dir / "shards").exists() and not (run_dir / "shards.incomplete").exists()
    work = run_dir / "shards.work"
    done = sorted(p.name for p in (work / "logs" / "encode" / "completions").iterdir())
    assert done == [f"{i:05d}" for i in range(PART_THAT_FAILS)]
    return run_dir, work


def test_a_killed_task_is_redone_and_finished_ones_are_not(demo_run, tmp_path, monkeypatch):
    run_dir, work = killed_run(demo_run, tmp_path, monkeypatch)
    n_parts = len(reference_files(demo_run)) // 2
    finished = {
        p.name: p.stat().st_mtime_ns
        for i in range(PART_THAT_FAILS)
        for p in (work / "encode").glob(f"*-{i:05d}.*")
    }
    log = tmp_path / "encoded.log"
    record_parts(monkeypatch, log)
    two = load_run_config(run_dir, values={"data_engine.workers": 2})
    result = run_stage("shards", two, run_dir)
    assert encoded_parts(log) == list(range(PART_THAT_FAILS, n_parts))
    out = run_dir / "shards"
    assert {n: (out / n).stat().st_mtime_ns for n in finished} == finished  # moved, not redone
    assert token_files(run_dir) == reference_files(demo_run)
    assert without_timing(result) == without_timing(manifest(demo_run))
    assert not work.exists()


def test_resume_redoes_a_finished_part_whose_files_are_damaged(
    demo_run, tmp_path, monkeypatch, cli
):
    run_dir, work = killed_run(demo_run, tmp_path, monkeypatch)
    encoded = work / "encode"
    (encoded / "val-00000.bin").write_bytes(b"")  # a finished part damaged afterwards
    sidecar = encoded / "part-00001.json"
    sidecar.write_text(sidecar.read_text()[:20])  # cut mid-way: not JSON any more
    log = tmp_path / "encoded.log"
    record_parts(monkeypatch, log)
    result = cli("shards", "--run", run_dir)
    assert result.code == 0, result.err
    assert "part 0 is encoded again: val-00000.bin has 0 bytes" in result.err
    assert "part 1 is encoded again: part-00001.json cannot be read" in result.err
    n_parts = len(reference_files(demo_run)) // 2
    assert encoded_parts(log) == list(range(n_parts))
    assert token_files(run_dir) == reference_files(demo_run)


def test_resume_with_an_unreadable_work_fingerprint_starts_over(
    demo_run, tmp_path, monkeypatch, cli
):
    run_dir, work = killed_run(demo_run, tmp_path, monkeypatch)
    (work / "fingerprint").write_text("{")
    log = tmp_path / "encoded.log"
    record_parts(monkeypatch, log)
    result = cli("shards", "--run", run_dir)
    assert result.code == 0, result.err
    assert encoded_parts(log) == list(range(len(reference_files(demo_run)) // 2))
    assert without_timing(manifest(run_dir)) == without_timing(manifest(demo_run))


def test_an_empty_corpus_folder_is_a_user_error(demo_run, tmp_path, cli):
    run_dir = tmp_path / "empty"
    shutil.copytree(demo_run, run_dir)
    for part in corpus_parts(training_corpus_dir(run_dir)):
        part.unlink()
    result = cli("shards", "--run", run_dir, "--force")
    # a finished corpus whose parts are gone is damaged: the stage that makes it is named
    assert_user_error(result, "is damaged", "part-00000.jsonl.zst is missing", "--force")
    assert not (run_dir / "shards.work").exists()
    assert (run_dir / "shards" / "manifest.json").is_file()  # the earlier shards stay


def test_rerun_encodes_again_when_finished_shards_are_damaged(demo_run, tmp_path, cli):
    run_dir = tmp_path / "damaged"
    shutil.copytree(demo_run, run_dir)
    part = run_dir / "shards" / "train-00000.bin"
    expected = part.read_bytes()
    part.write_bytes(expected[: len(expected) // 2])
    result = cli("shards", "--run", run_dir)
    assert result.code == 0, result.err
    assert "train-00000.bin has" in result.err and "making it again" in result.err
    assert part.read_bytes() == expected


def test_rerun_skips_and_a_new_tokenizer_encodes_again(demo_run, tmp_path, cli):
    run_dir = tmp_path / "mismatch"
    shutil.copytree(demo_run, run_dir)
    marker = run_dir / "shards" / "stage.json"
    before = marker.read_text()
    assert cli("shards", "--run", run_dir).code == 0
    assert marker.read_text() == before
    cfg = load_run_config(run_dir, values={"tokenizer.vocab_size": 768})
    run_stage("tokenizer", cfg, run_dir)
    # until the shards are made again, training refuses them: their ids are another tokenizer's
    with pytest.raises(UserError, match="another tokenizer"):
        run_facts.shards_manifest(run_dir)
    assert cli("shards", "--run", run_dir, "--set", "tokenizer.vocab_size=768").code == 0
    assert marker.read_text() != before  # the tokenizer is upstream: the shards are redone
    assert manifest(run_dir).vocab_size == 768
    run_facts.shards_manifest(run_dir)


def test_uint32_for_large_vocabularies():
    assert shards.token_dtype(65536) == np.uint16
    assert shards.token_dtype(65537) == np.uint32


def test_no_tokenizer_is_a_user_error(tmp_path, cli):
    result = cli("shards", "--run", tmp_path / "none")
    assert_user_error(result, "no finished tokenizer")
    assert not (tmp_path / "none" / "shards").exists()


def test_every_document_of_a_token_file_is_in_its_index(demo_run):
    """Each token file's document index lists its documents in order, each starting where the
    end-of-document token before it ends: any token traces back to its document."""
    from hanlm.streams import open_text_stream

    m = manifest(demo_run)
    for split in ("train", "val"):
        for entry in m.splits[split].files:
            tokens = np.fromfile(demo_run / "shards" / entry.path, dtype=m.dtype)
            with open_text_stream(demo_run / "shards" / entry.documents_index.path) as stream:
                starts = [__import__("json").loads(line)["start"] for line in stream]
            ends = np.flatnonzero(tokens == m.eod_id)
            assert starts == [0, *(ends[:-1] + 1).tolist()] and len(starts) == entry.documents
    entry = m.splits["train"].files[0]
    middle = entry.tokens // 2
    found = shards.trace(demo_run / "shards", entry.path, middle)
    tokens = np.fromfile(demo_run / "shards" / entry.path, dtype=m.dtype)
    assert found["start"] <= middle and m.eod_id not in tokens[found["start"] : middle].tolist()
    with pytest.raises(UserError, match="has no token"):
        shards.trace(demo_run / "shards", entry.path, entry.tokens)


def test_a_training_token_traces_back_to_its_source_row(tmp_path):
    """A FineWeb-shaped source's own ids and metadata (url) go through corpus and decontam
    into the shards' document index: a token of a token file names its document's row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import DEMO_RUN_VALUES
    from hanlm.config import load_config
    from hanlm.pipeline import run_pipeline

    rows = [{"id": f"<urn:uuid:{i}>", "url": f"https://example.kr/{i}",
             "text": f"{i}번 문서입니다. 한국어 웹 문장이 여기에 길게 이어집니다. " * 8}
            for i in range(60)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "web.parquet")
    source = {"name": "web", "inputs": [str(tmp_path / "web.parquet")], "metadata": ["url"]}
    values = {**DEMO_RUN_VALUES, "corpus.sources": [source], "corpus.near_dedup": False,
              "tokenizer.vocab_size": 512, "decontam.benchmarks": []}  # fmt: skip
    run_pipeline(load_config(values=values), tmp_path / "r", until="shards")
    m = manifest(tmp_path / "r")
    entry = m.splits["train"].files[0]
    found = shards.trace(tmp_path / "r" / "shards", entry.path, entry.tokens - 2)
    number = int(found["id"].removeprefix("<urn:uuid:").removesuffix(">"))
    assert found["metadata"] == {"url": f"https://example.kr/{number}"}
    assert found["source"] == "web"
