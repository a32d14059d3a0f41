"""`read = "needed"`: a source is read as far as its share of the training budget needs, in
tasks drawn across its files in a seeded order; the same settings read the same documents, a
larger budget reads a superset, and the stage's fingerprint follows what is read."""

from __future__ import annotations

import random

import pytest

from hanlm.config import load_config
from hanlm.data import read_plan
from hanlm.data.corpus import CorpusStats, iter_corpus
from hanlm.pipeline import current_fingerprint, run_stage
from hanlm.stages.rundir import RunDir

WEB_FILES, DOCS_PER_FILE = 16, 30
BATCH = 14_336  # training tokens per step: the web's half of one step needs ~24k characters


def web(tmp_path):
    """16 FineWeb-shaped parquet files, every document different (no duplicate is removed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "web"
    folder.mkdir()
    rng = random.Random(0)
    for f in range(WEB_FILES):
        rows = [{"id": f"web-{f}-{i}", "text": _text(rng)} for i in range(DOCS_PER_FILE)]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{f:03d}.parquet")
    return folder


def _text(rng) -> str:
    words = ("".join(chr(0xAC00 + rng.randrange(11172)) for _ in range(3)) for _ in range(50))
    return " ".join(words)  # 199 characters


def recipe(tmp_path, steps=1, **values):
    wiki = tmp_path / "wiki.jsonl"
    if not wiki.exists():
        wiki.write_text(
            "".join(f'{{"id": "w{i}", "text": "위키 문서 {i}: 짧은 글"}}\n' for i in range(20)),
            encoding="utf-8",
        )
    sources = [
        {"name": "web", "inputs": [str(tmp_path / "web" / "*.parquet")], "weight": 0.5},
        {"name": "wiki", "inputs": [str(wiki)], "weight": 0.5},
    ]
    return load_config(
        values={
            "corpus.sources": sources,
            "corpus.min_chars": 1,
            "pretrain.max_steps": steps,
            "pretrain.global_batch_tokens": BATCH,
            "data_engine.task_mb": 1,
            **values,
        }
    )


def web_ids(run_dir) -> list[str]:
    return [d["id"] for d in iter_corpus(run_dir / "corpus") if d["id"].startswith("web-")]


def test_needed_characters_follow_the_share_the_margin_and_the_setting(tmp_path):
    cfg = recipe(tmp_path)
    assert read_plan.needed_characters(cfg) == {"web": 23_296, "wiki": 23_296}  # 7,168 x 2.5 x 1.3
    sources = [
        dict(s.model_dump(), read=r) for s, r in zip(cfg.corpus.sources, ("all", 1000), strict=True)
    ]
    other = load_config(values={**_values(cfg), "corpus.sources": sources,
                                "corpus.read_margin": 1.0, "corpus.chars_per_token": 3.0})  # fmt: skip
    assert read_plan.needed_characters(other) == {"web": None, "wiki": 3000}
    no_budget = load_config(values={**_values(cfg), "pretrain.max_steps": None})
    assert read_plan.needed_characters(no_budget) == {"web": None, "wiki": None}
    flat = load_config(values={"corpus.inputs": ["demo"], "pretrain.max_steps": 10})
    assert read_plan.needed_characters(flat) == {"corpus": None}  # no share to size it by


def _values(cfg):
    return {"corpus.sources": [s.model_dump() for s in cfg.corpus.sources],
            "pretrain.max_steps": cfg.pretrain.max_steps,
            "pretrain.global_batch_tokens": cfg.pretrain.global_batch_tokens}  # fmt: skip


def test_a_source_is_read_as_far_as_its_share_needs_and_the_same_way_twice(tmp_path):
    web(tmp_path)
    cfg = recipe(tmp_path)
    stats = run_stage("corpus", cfg, tmp_path / "a")
    read = stats.reads["web"]
    need = read_plan.needed_characters(cfg)["web"]
    per_file = DOCS_PER_FILE * 199
    assert not read.whole and read.tasks == WEB_FILES and 1 < read.tasks_read < WEB_FILES // 2
    assert need <= stats.sources["web"].characters_in < need + 1.2 * per_file
    assert stats.reads["wiki"].whole  # holds less than its share: read whole
    assert "corpus.read_margin" in read.why and read.bytes_per_character > 1
    files = {i.split("-")[1] for i in web_ids(tmp_path / "a")}
    assert files != {str(f) for f in range(len(files))}  # drawn across the files, not the first
    # the same settings read the same documents; another seed draws other tasks
    run_stage("corpus", cfg, tmp_path / "b")
    assert web_ids(tmp_path / "b") == web_ids(tmp_path / "a")
    reseeded = load_config(values={**_values(cfg), "run.seed": 7, "corpus.min_chars": 1,
                                   "data_engine.task_mb": 1})  # fmt: skip
    run_stage("corpus", reseeded, tmp_path / "c")
    assert web_ids(tmp_path / "c") != web_ids(tmp_path / "a")
    # a larger budget reads further along the same order: a superset, and the stage re-runs
    larger = recipe(tmp_path, steps=2)
    fp = current_fingerprint("corpus", cfg, RunDir(tmp_path / "a"))
    assert current_fingerprint("corpus", larger, RunDir(tmp_path / "a")) != fp
    unrelated = load_config(values={**_values(cfg), "optimizer.lr": 1e-4,
                                    "corpus.min_chars": 1, "data_engine.task_mb": 1})  # fmt: skip
    assert current_fingerprint("corpus", unrelated, RunDir(tmp_path / "a")) == fp
    more = run_stage("corpus", larger, tmp_path / "a")
    assert more.reads["web"].tasks_read > read.tasks_read
    assert set(web_ids(tmp_path / "b")) < set(web_ids(tmp_path / "a"))
    on_disk = CorpusStats.read(tmp_path / "a" / "corpus" / CorpusStats.FILE)
    assert on_disk.reads["web"].tasks_read == more.reads["web"].tasks_read
    run_stage("report", larger, tmp_path / "a")
    report = " ".join((tmp_path / "a" / "report.md").read_text().split())
    assert "Sources read as far as the mix needs" in report
    assert f"**web**: {more.reads['web'].tasks_read} of {WEB_FILES} tasks" in report


@pytest.mark.parametrize("read", ["all", 10**9])
def test_all_or_more_than_it_holds_reads_every_task(tmp_path, read):
    web(tmp_path)
    cfg = recipe(tmp_path)
    sources = [dict(s.model_dump(), read=read) for s in cfg.corpus.sources]
    cfg = load_config(values={**_values(cfg), "corpus.sources": sources, "corpus.min_chars": 1,
                              "data_engine.task_mb": 1})  # fmt: skip
    stats = run_stage("corpus", cfg, tmp_path / "r")
    assert stats.reads["web"].whole and stats.reads["web"].tasks_read == WEB_FILES
    assert len(web_ids(tmp_path / "r")) == WEB_FILES * DOCS_PER_FILE


def test_the_plan_says_what_each_source_holds_and_reads(tmp_path, cli):
    web(tmp_path)
    cfg = recipe(tmp_path)
    from hanlm.plan import data_rates

    rows = {row["source"]: row for row in data_rates.mixture_preview(cfg)}
    need = read_plan.needed_characters(cfg)["web"]
    assert rows["web"]["reads"] == pytest.approx(need / 2.5)
    assert rows["web"]["reads"] < rows["web"]["available"]
    assert rows["wiki"]["reads"] is None  # holds less than its share needs: read whole
    size, basis, _, _ = data_rates.read_size(cfg)
    assert "web" in basis and "wiki whole" in basis
    assert size < data_rates.source_bytes(cfg, cfg.corpus.sources[0]) + 10_000


@pytest.mark.parametrize("bad", ["neded", 0, -5, 2.5, True])
def test_a_bad_read_is_one_clear_error(bad):
    from hanlm.errors import UserError

    source = {"name": "web", "inputs": ["demo:web"], "weight": 1.0, "read": bad}
    with pytest.raises(UserError, match=r"corpus\.sources\[0\] \('web'\)\.read: read must be"):
        load_config(values={"corpus.sources": [source]})
