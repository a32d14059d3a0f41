import json
import shutil

import numpy as np
import pytest

from conftest import assert_user_error
from hanlm.data import shards
from hanlm.data.corpus import iter_corpus
from hanlm.data.shards import WORK_MARKER
from hanlm.errors import UserError
from hanlm.stages import shards as shards_stage
from hanlm.stages import tokenizer as tokenizer_stage
from hanlm.stages.corpus import training_corpus_dir
from hanlm.stages.rundir import load_run_config


def manifest(run_dir):
    return json.loads((run_dir / "shards" / "manifest.json").read_text())


def read_split(run_dir, split):
    m = manifest(run_dir)
    files = m["splits"][split]["files"]
    return [np.fromfile(run_dir / "shards" / f["path"], dtype=m["dtype"]) for f in files]


def test_totals_equal_direct_encoding(demo_run):
    tok = tokenizer_stage.load(demo_run)
    m = manifest(demo_run)
    eod = m["eod_id"]
    expected = {"train": [], "val": []}
    for i, doc in enumerate(iter_corpus(training_corpus_dir(demo_run))):
        split = "val" if i == 0 or shards.is_val(doc["id"], 0, 0.02) else "train"
        expected[split].extend([*tok.encode(doc["text"]).ids, eod])
    for split in ("train", "val"):
        tokens = np.concatenate(read_split(demo_run, split))
        assert tokens.tolist() == expected[split]
        assert m["splits"][split]["tokens"] == len(expected[split])
        assert m["splits"][split]["documents"] == expected[split].count(eod)
    assert m["splits"]["val"]["documents"] >= 1


def test_manifest_fields(demo_run):
    m = manifest(demo_run)
    assert m["dtype"] == "uint16" and m["vocab_size"] == 1024
    sha = json.loads((demo_run / "tokenizer" / "stats.json").read_text())["tokenizer_sha256"]
    assert m["tokenizer_sha256"] == sha
    counts = m["special_token_counts"]
    assert counts["<|endoftext|>"] == m["splits"]["train"]["documents"]
    # Pretraining text never holds chat tokens: SFT must know they are untrained.
    for token in ("<|system|>", "<|user|>", "<|assistant|>", "<|eot|>", "<|pad|>"):
        assert counts[token] == 0
    for f in m["splits"]["train"]["files"]:
        size = (demo_run / "shards" / f["path"]).stat().st_size
        assert size == f["tokens"] * 2


def test_one_and_two_workers_give_identical_shards(demo_run, tmp_path):
    other = tmp_path / "one"
    shutil.copytree(demo_run, other)
    cfg = load_run_config(other, values={"shards.workers": 1})
    shards_stage.run(cfg, other, force=True)
    assert manifest(other)["workers"] == 1
    for split in ("train", "val"):
        for a, b in zip(read_split(demo_run, split), read_split(other, split), strict=True):
            assert np.array_equal(a, b)


def test_resume_skips_finished_parts_and_redoes_damaged_ones(demo_run, tmp_path):
    run_dir = tmp_path / "resume"
    shutil.copytree(demo_run, run_dir)
    cfg = load_run_config(run_dir)
    # Simulate a run killed after some parts: the work folder holds finished parts only.
    work = run_dir / "shards.incomplete"
    shutil.move(run_dir / "shards", work)
    (work / "manifest.json").unlink()
    (work / "stage.json").unlink()
    n_parts = len(list(work.glob("part-*.json")))
    assert n_parts >= 4, "the fixture should have parts to damage and parts to keep"
    for p in sorted(work.glob("part-*.json"))[n_parts // 2 :]:
        p.unlink()
    expected = {p.name: p.read_bytes() for p in work.glob("*-*.bin")}
    kept = {p.name: p.stat().st_mtime_ns for p in work.glob("train-*.bin")}
    # Finished parts that were damaged afterwards: their size or checksum no longer matches.
    (work / "train-00000.bin").write_bytes(b"garbage")
    truncated = work / "val-00001.bin"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    (work / "train-00001.bin").write_bytes(b"\0" * (work / "train-00001.bin").stat().st_size)
    for name in ("train-00000.bin", "train-00001.bin"):
        kept.pop(name)
    shards_stage.run(cfg, run_dir)
    out = run_dir / "shards"
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("train-*.bin")}
    redone = [name for name in kept if after[name] != kept[name]]
    assert len(redone) == n_parts - n_parts // 2  # intact finished parts are reused
    for name in ("train-00000.bin", "train-00001.bin", "val-00001.bin"):
        assert (out / name).read_bytes() == expected[name], f"{name} was not encoded again"
    assert not work.exists()


def test_resume_redoes_a_part_whose_sidecar_is_damaged(demo_run, tmp_path, cli):
    run_dir = tmp_path / "resume"
    shutil.copytree(demo_run, run_dir)
    work = run_dir / "shards.incomplete"
    shutil.move(run_dir / "shards", work)
    (work / "stage.json").unlink()
    expected = (work / "train-00002.bin").read_bytes()
    kept = (work / "train-00000.bin").stat().st_mtime_ns
    (work / "train-00002.bin").write_bytes(b"")
    sidecar = work / "part-00002.json"
    sidecar.write_text(sidecar.read_text()[:20])  # cut mid-way: not JSON any more
    (work / "part-00003.json").write_text("{}")  # JSON, but not a sidecar
    result = cli("shards", "--run", run_dir)
    assert result.code == 0, result.err
    assert "part 3 is encoded again" in result.err
    assert (run_dir / "shards" / "train-00002.bin").read_bytes() == expected
    assert (run_dir / "shards" / "train-00000.bin").stat().st_mtime_ns == kept


def test_resume_with_an_unreadable_work_marker_starts_over(demo_run, tmp_path, cli):
    run_dir = tmp_path / "resume"
    shutil.copytree(demo_run, run_dir)
    work = run_dir / "shards.incomplete"
    shutil.move(run_dir / "shards", work)
    (work / "stage.json").unlink()
    (work / WORK_MARKER).write_text("{")
    result = cli("shards", "--run", run_dir)
    assert result.code == 0, result.err
    assert manifest(run_dir) == {**manifest(demo_run), "seconds": manifest(run_dir)["seconds"]}


def test_rerun_encodes_again_when_finished_shards_are_damaged(demo_run, tmp_path, cli):
    run_dir = tmp_path / "damaged"
    shutil.copytree(demo_run, run_dir)
    part = run_dir / "shards" / "train-00000.bin"
    expected = part.read_bytes()
    part.write_bytes(expected[: len(expected) // 2])
    result = cli("shards", "--run", run_dir)
    assert result.code == 0, result.err
    assert "train-00000.bin has" in result.err and "encoding again" in result.err
    assert part.read_bytes() == expected


def test_rerun_skips_and_tokenizer_mismatch_is_refused(demo_run, tmp_path, cli):
    run_dir = tmp_path / "mismatch"
    shutil.copytree(demo_run, run_dir)
    marker = run_dir / "shards" / "stage.json"
    before = marker.read_text()
    assert cli("shards", "--run", run_dir).code == 0
    assert marker.read_text() == before
    cfg = load_run_config(run_dir, values={"tokenizer.vocab_size": 768})
    tokenizer_stage.run(cfg, run_dir)
    result = cli("shards", "--run", run_dir, "--set", "tokenizer.vocab_size=768")
    assert_user_error(result, "another tokenizer", "--force")
    assert marker.read_text() == before  # the old shards are untouched
    with pytest.raises(UserError, match="another tokenizer"):
        shards_stage.load_manifest(run_dir)
    assert cli("shards", "--run", run_dir, "--set", "tokenizer.vocab_size=768", "--force").code == 0
    assert manifest(run_dir)["vocab_size"] == 768


def test_uint32_for_large_vocabularies():
    assert shards.token_dtype(65536) == np.uint16
    assert shards.token_dtype(65537) == np.uint32


def test_no_tokenizer_is_a_user_error(tmp_path, cli):
    result = cli("shards", "--run", tmp_path / "none")
    assert_user_error(result, "no finished tokenizer")
    assert not (tmp_path / "none" / "shards").exists()
