"""Decontamination: planted benchmark items are found in every style, with exact report counts;
the stage slots between corpus and tokenizer; standalone, shard + merge, bad inputs."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import zstandard

import leaks
from conftest import (
    KOBEST_FOLDERS,
    copy_data_run,
    korquad_contexts,
    run_subprocess,
    write_jsonl,
)
from hanlm import demo, pipeline
from hanlm.config import load_config
from hanlm.data import corpus as corpus_lib
from hanlm.data import decontam
from hanlm.data.decontam import folding as folding_module
from hanlm.data.decontam import hashing as hashing_module
from hanlm.data.decontam import index as index_module
from hanlm.data.decontam import outputs as outputs_module
from hanlm.data.decontam import scan as scan_module
from hanlm.data.decontam.folding import fold, fold_texts, nfc, normalise
from hanlm.data.decontam.index import DEFAULT_NGRAM, STRIDE
from hanlm.data.decontam.outputs import DecontamReport
from hanlm.data.shards import ShardsManifest
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages import decontam as decontam_stage
from hanlm.stages import run_facts
from hanlm.stages.rundir import RunDir, load_run_config
from hanlm.stages.stage import NotNeeded
from hanlm.testsets import readers

# ---------------------------------------------------------------------------------------------
# Planting


STYLES = {
    "verbatim": lambda t, filler, rng: t,
    "spacing": lambda t, filler, rng: leaks.respace(t, rng),
    "punctuation": lambda t, filler, rng: leaks.strip_punctuation(t),
    "embedded": lambda t, filler, rng: leaks.embed(t, filler, rng),
}


def plant(items: list, filler: list[str], seed: int = 0) -> tuple[list[dict], dict]:
    """Documents: unrelated filler plus items in every style, halves, and the expected status."""
    rng = random.Random(seed)
    docs = [{"id": f"filler-{i}", "text": t} for i, t in enumerate(filler)]
    expected = {}
    for i, item in enumerate(items[:24]):
        style = list(STYLES)[i % 4]
        docs.append(
            {"id": f"plant-{style}-{i}", "text": STYLES[style](item.overlap_text, filler, rng)}
        )
        expected[item.item_id] = "dirty"
    for item in items[24:30]:  # the first half of the item, inside a filler document
        text = item.overlap_text
        half = text[: len(text) // 2]
        docs.append({"id": f"half-{item.item_id}", "text": leaks.embed(half, filler, rng)})
        expected[item.item_id] = "partial"
    rng.shuffle(docs)
    return docs, expected


def status_of(items_jsonl: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in items_jsonl.read_text().splitlines()]
    return {r["item_id"]: r for r in rows}


def check_planted(out: Path, items: list, expected: dict) -> None:
    rows = status_of(out / "decontam" / "items.jsonl")
    assert len(rows) == len(items)
    for item_id, status in expected.items():
        assert rows[item_id]["status"] == status, (item_id, rows[item_id])
    for item_id, row in rows.items():
        if item_id not in expected:
            assert row["status"] == "clean", row
    report = DecontamReport.read(out / "decontam" / DecontamReport.FILE)
    (bench,) = {i.benchmark for i in items}
    dirty = sum(s == "dirty" for s in expected.values())
    partial = sum(s == "partial" for s in expected.values())
    counts = report.benchmarks[bench]
    assert counts.model_dump() == {
        "items": len(items),
        "dirty": dirty,
        "partial": partial,
        "clean": len(items) - dirty - partial,
        "found_whole": counts.found_whole,
        "found_only_by_parts": dirty + partial - counts.found_whole,
    }
    md = (out / "decontam" / "report.md").read_text()
    clean = len(items) - dirty - partial
    assert f"| {bench} | {len(items):,} | {dirty:,} | {partial:,} | {clean:,} |" in md


@pytest.fixture(scope="module")
def demo_world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    world = demo.build(size_mb=0.2, benchmark_items=60, planted_fraction=0.0, conversations=5)
    return world, demo.write(world, out)


def test_planted_kobest_items_found_in_every_style(shared_data, tmp_path, cli):
    items = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")[:60]
    filler = [c for c in korquad_contexts(shared_data)[:200]]
    docs, expected = plant(items, filler)
    path = write_jsonl(tmp_path / "train.jsonl", docs)
    bench = f"kobest_boolq={shared_data / 'kobest/BoolQ/dev.tsv'}"
    # The index holds all 700 dev items; only the planted ones may be found.
    all_items = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")
    result = cli("decontam", "--corpus", path, "--out", tmp_path / "o", "--benchmark", bench)
    assert result.code == 0, result.err
    check_planted(tmp_path / "o", all_items, expected)
    rows = status_of(tmp_path / "o" / "decontam" / "items.jsonl")
    assert rows[items[3].item_id]["documents"] == ["plant-embedded-3"]


def standalone(cfg, corpus: list[str], out: Path) -> DecontamReport | None:
    """`hanlm decontam --corpus GLOB --out OUT` from Python."""
    return run_stage(
        "decontam", cfg, RunDir(out), save_config=False, standalone=True, corpus=corpus
    )


def test_planted_demo_items_found_in_every_style(demo_world, tmp_path):
    world, paths = demo_world
    items = readers.read("demo_qa", paths["benchmark"])
    filler = [d["text"] for d in world.documents]
    docs, expected = plant(items, filler)
    path = write_jsonl(tmp_path / "train.jsonl", docs)
    cfg = load_config(values={"decontam.benchmarks": [f"demo_qa={paths['benchmark']}"]})
    standalone(cfg, [str(path)], tmp_path / "o")
    check_planted(tmp_path / "o", items, expected)


def test_same_topic_written_differently_is_clean(shared_data):
    items = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")
    serbian = next(i for i in items if i.item_id == "1")  # the second row
    assert "세르비아" in serbian.fields["paragraph"]
    index = decontam.BenchmarkIndex.build([serbian])
    rewritten = (
        "세르비아 사람들에게 빵은 끼니마다 빠지지 않는 음식이다. 빵은 이 나라 음식 문화의 "
        "중심에 있고, 종교 행사에서도 빵을 올린다. 빵을 함부로 버리거나 던지면 큰 실례로 "
        "여긴다고 한다. 세르비아 요리에서 빵은 가장 기본이 되는 음식일까?"
    )
    (row,) = index.check([rewritten, serbian.overlap_text])
    assert row["status"] == "dirty" and row["documents"] == [1]
    (row,) = index.check([rewritten])
    assert row["status"] == "clean" and row["coverage"] < 0.2


def test_short_items_matched_whole_and_chat_messages_count(shared_data, tmp_path, cli):
    senti = readers.read("kobest_sentineg", shared_data / "kobest/SentiNeg/dev.tsv")
    short = [i for i in senti if len(normalise(i.overlap_text)) < DEFAULT_NGRAM][:3]
    copa = readers.read("kobest_copa", shared_data / "kobest/COPA/dev.tsv")[:2]
    filler = korquad_contexts(shared_data)[:30]
    chats = [
        {"messages": [{"role": "user", "content": "리뷰를 써 줘"},
                      {"role": "assistant", "content": f"네. {short[0].overlap_text}!!"}]},
        {"messages": [{"role": "user", "content": copa[0].fields["premise"]},
                      {"role": "assistant", "content": copa[0].fields["alternative_2"]}]},
    ]  # fmt: skip
    write_jsonl(tmp_path / "chat.jsonl", chats)
    text = "\n\n".join([filler[0], f"후기: {short[1].overlap_text.replace(' ', '')}", filler[1]])
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "more.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": filler[2]}, ensure_ascii=False) + "\n")
    out = tmp_path / "o"
    args = ["decontam", "--corpus", tmp_path / "*.*", "--out", out, "--workers", "1"]
    for task, folder in (("kobest_sentineg", "SentiNeg"), ("kobest_copa", "COPA")):
        args += ["--benchmark", f"{task}={shared_data / 'kobest' / folder / 'dev.tsv'}"]
    assert cli(*args).code == 0
    lines = (out / "decontam/items.jsonl").read_text().splitlines()
    rows = {(r["benchmark"], r["item_id"]): r for r in map(json.loads, lines)}
    assert rows["kobest_sentineg", short[0].item_id]["status"] == "dirty"
    assert rows["kobest_sentineg", short[1].item_id]["documents"] == ["plain.txt:3"]
    assert rows["kobest_sentineg", short[2].item_id]["status"] == "clean"
    assert rows["kobest_copa", copa[0].item_id]["status"] == "dirty"  # premise + answer, chat
    assert rows["kobest_copa", copa[1].item_id]["status"] == "clean"


@pytest.fixture
def real_items(shared_data):
    """Every KoBEST dev item and the GSM8K-ko sample, as decontamination reads them."""
    from hanlm.evals.tasks import with_prompt_form

    items = []
    for task, folder in KOBEST_FOLDERS.items():
        items += readers.read(task, shared_data / "kobest" / folder / "dev.tsv")
    items += readers.read("gsm8k_ko", shared_data / "gsm8k-ko" / "test_first300.jsonl")
    return [with_prompt_form(i) for i in items]


def test_items_found_in_their_natural_forms(real_items, shared_data):
    """Every leak style, on real items of every task, among real Wikipedia paragraphs: recall
    >= 0.95 per style and task, and at most 2% of the other items flagged."""
    filler = korquad_contexts(shared_data)
    rng = random.Random(0)
    docs, planted = list(filler), {}
    per_style = 12
    for task in [*KOBEST_FOLDERS, "gsm8k_ko"]:
        pool = [k for k, item in enumerate(real_items) if item.benchmark == task]
        rng.shuffle(pool)
        for style in leaks.STYLES:
            chosen = [k for k in pool if style in leaks.styles_for(real_items[k])][:per_style]
            for k in chosen:
                docs.append(leaks.plant(real_items[k], style, filler, rng))
                planted[k] = style
                pool.remove(k)
    rng.shuffle(docs)
    index = decontam.BenchmarkIndex.build(real_items)
    rows = index.check(docs)
    recall: dict[tuple[str, str], list[bool]] = {}
    false_alarms: dict[str, list[bool]] = {}
    for k, row in enumerate(rows):
        task = real_items[k].benchmark
        if k in planted:
            style = planted[k]
            ok = (
                row["status"] != "clean"
                if style in leaks.EXPECT_PARTIAL
                else row["status"] == "dirty"
            )
            recall.setdefault((task, style), []).append(ok)
        else:
            false_alarms.setdefault(task, []).append(row["status"] != "clean")
    assert len(recall) >= 35  # every style that applies, for every task
    for key, hits in recall.items():
        assert sum(hits) / len(hits) >= 0.95, (key, f"{sum(hits)}/{len(hits)}")
    for task, flags in false_alarms.items():
        assert sum(flags) / len(flags) <= 0.02, (task, f"{sum(flags)}/{len(flags)}")
    by_parts = [r for k, r in enumerate(rows) if planted.get(k) in ("connective", "reordered")]
    assert all(r["found_by"] == "parts" for r in by_parts if r["benchmark"] == "kobest_copa")


def _item(benchmark: str, *parts: str, forms: tuple[str, ...] = ()) -> readers.Item:
    return readers.Item(benchmark, parts[0][:8], {}, "\n".join(parts), tuple(parts), forms)


def test_short_parts_count_only_together():
    copa = _item("kobest_copa", "전쟁이 시작되었다.", "병사들이 전투에 파견되었다.")
    other = _item("kobest_copa", "아이가 울음을 터뜨렸다.", "엄마가 아이를 안아 주었다.")
    index = decontam.BenchmarkIndex.build([copa, other])
    texts = {
        "connective": "그날 아침 전쟁이 시작되었다. 그래서 병사들이 전투에 파견되었다. 마을은 조용했다.",
        "cause first": "전쟁이 시작되어서, 병사들이 전투에 파견되었다.",
        "because": "병사들이 전투에 파견되었다. 왜냐하면 전쟁이 시작되었기 때문이다.",
        "lines apart": "병사들이 전투에 파견되었다.\n\n(중략)\n\n전쟁이 시작되었다.",
    }
    for name, text in texts.items():
        (row, _) = index.check([text])
        assert row["status"] == "dirty" and row["found_by"] == "parts", name
    # One part alone, or the parts in different documents: nothing.
    alone = ["전쟁이 시작되었다는 소식이 들렸다.", "병사들이 전투에 파견되었다."]
    assert [r["status"] for r in index.check(alone)] == ["clean", "clean"]
    assert index.matches(texts["because"], min_coverage=0.5)[0]["coverage"] == 1.0
    assert index.matches(alone[1], min_coverage=0.01) == []


def test_a_long_part_stands_alone_and_half_a_passage_is_partial():
    passage = (
        "세르비아 요리에서 빵은 매끼 식사에 빠지지 않는 기본 음식이며, 빵을 버리는 것은 "
        "큰 실례로 여겨진다. 종교 의식에서도 빵이 중요한 역할을 한다."
    )
    boolq = _item("kobest_boolq", passage, "세르비아 요리에서 빵은 중요한가?")
    index = decontam.BenchmarkIndex.build([boolq])
    (row,) = index.check(["관련 없는 글.\n" + passage])
    assert row["status"] == "dirty" and row["coverage"] >= 0.8
    (row,) = index.check([passage[: len(passage) // 2]])
    assert row["status"] == "partial" and 0.35 <= row["coverage"] <= 0.6


def test_a_short_one_part_item_counts_only_as_a_whole_segment():
    review = _item("kobest_sentineg", "최고네요", forms=("문장: 최고네요 긍부정:",))
    index = decontam.BenchmarkIndex.build([review])
    found = [
        "최고네요",
        "배송 빨라요.\n최고네요!\n또 살게요",
        "평점: 5, 최고네요.",
        "문장: 최고네요 긍부정: 긍정",
    ]
    not_found = ["가성비 최고네요", "최고네요 진짜", "이 집 떡볶이 최고네요 ㅎㅎ"]
    assert [r["status"] for r in index.check(found)] == ["dirty"]
    for text in found:
        assert index.check([text])[0]["status"] == "dirty", text
    for text in not_found:
        assert index.check([text])[0]["status"] == "clean", text


# ---------------------------------------------------------------------------------------------
# The index


def test_stride_scan_equals_every_window_scan(demo_world, monkeypatch):
    world, paths = demo_world
    items = readers.read("demo_qa", paths["benchmark"])[:20]
    index = decontam.BenchmarkIndex.build(items)
    rng = random.Random(1)
    filler = [d["text"] for d in world.documents[:40]]
    texts = list(filler)
    for item in items[:15]:  # stretches of every length from n + STRIDE - 1 up
        norm = normalise(item.overlap_text)
        length = rng.randint(DEFAULT_NGRAM + STRIDE - 1, len(norm))
        start = rng.randint(0, len(norm) - length)
        texts.insert(rng.randint(0, len(texts)), rng.choice(filler) + norm[start : start + length])
    strided = index.check(texts)
    monkeypatch.setattr(index_module, "STRIDE", 1)  # hash every window
    assert index.check(texts) == strided
    assert sum(r["status"] != "clean" for r in strided) >= 10
    # And against plain Python, for items none of whose n-grams another item shares.
    norm_texts = [normalise(t) for t in texts]
    compared = 0
    for k, item in enumerate(items[:15]):
        mine = set().union(*(_grams(normalise(t)) for t in (item.overlap_text, *item.parts)))
        others = set().union(
            *(
                _grams(normalise(t))
                for i in items
                if i is not item
                for t in (i.overlap_text, *i.parts)
            )
        )
        if not mine & others:
            assert strided[k]["coverage"] == pytest.approx(
                reference_coverage(item, norm_texts), abs=1e-4
            )
            compared += 1
    assert compared >= 3


def _grams(text: str, n: int = DEFAULT_NGRAM) -> set[str]:
    return {text[i : i + n] for i in range(len(text) - n + 1)}


def reference_coverage(item, norm_texts: list[str], n: int = DEFAULT_NGRAM) -> float:
    """The coverage rule in plain Python: the share of characters found, of the whole text or
    of the parts together (short parts by their stem, only in a text holding every part)."""
    seen = set().union(*(_grams(t) for t in norm_texts))

    def covered(target: str) -> int:
        hit = [False] * len(target)
        for i in range(len(target) - n + 1):
            if target[i : i + n] in seen:
                hit[i : i + n] = [True] * n
        return sum(hit)

    def stem(part: str) -> str:
        drop = index_module.STEM_DROP
        return part[:-drop] if len(part) - drop >= index_module.STEM_MIN else part

    def present(part: str, text: str) -> bool:
        return bool(_grams(part) & _grams(text)) if len(part) >= n else stem(part) in text

    whole = normalise(item.overlap_text)
    best = covered(whole) / len(whole)
    parts = [normalise(p) for p in item.parts]
    if len(parts) > 1:
        together = [t for t in norm_texts if all(present(p, t) for p in parts)]
        found = sum(
            covered(p) if len(p) >= n else len(p) * any(stem(p) in t for t in together)
            for p in parts
        )
        best = max(best, found / sum(map(len, parts)))
    return best


def test_index_save_load_check_and_matches(demo_world, tmp_path):
    _, paths = demo_world
    items = readers.read("demo_qa", paths["benchmark"])
    index = decontam.BenchmarkIndex.build(items, ngram=20)
    index.save(tmp_path / "index.npz")
    loaded = decontam.BenchmarkIndex.load(tmp_path / "index.npz")
    texts = ["관련 없는 글입니다.", items[5].overlap_text, items[7].overlap_text[:60]]
    assert loaded.check(texts) == index.check(texts)
    by_id = {r["item_id"]: r for r in index.check(texts)}
    assert by_id[items[5].item_id]["documents"] == [1]
    matches = index.matches(f"앞 글. {items[5].overlap_text} 뒤 글.", min_coverage=0.8)
    assert [m["item_id"] for m in matches] == [items[5].item_id]
    assert matches[0]["coverage"] == 1.0 and matches[0]["benchmark"] == "demo_qa"
    (tmp_path / "bad.npz").write_bytes(b"not an index")
    with pytest.raises(UserError, match="cannot read the decontamination index"):
        decontam.BenchmarkIndex.load(tmp_path / "bad.npz")


def test_batches_fold_as_their_nfc_texts():
    """The fast path (no character NFC could change) and the slow one fold alike."""
    texts = [
        "가나다 라마.",  # NFC already
        unicodedata.normalize("NFD", "한국어 문장"),  # decomposed Hangul
        "cafe\u0301 Å \u212b",  # a combining accent, the Angstrom sign
        "이모지 😀 와 한자 \uf900",  # beyond the BMP, a compatibility ideograph
        "",
    ]
    for batch in ([texts[0]], texts, texts[1:2], texts[3:]):
        chars, starts, _ = fold_texts(batch)
        expected = [fold(nfc(t))[0] for t in batch]
        assert chars.tolist() == [c for e in expected for c in e.tolist()]
        assert np.diff(starts).tolist() == [len(e) for e in expected]


def test_text_without_a_flagged_character_is_nfc_already():
    """The fast path's premise: the BMP table flags every character NFC could change or join
    to its neighbour, so strings of the others need no normalisation."""
    table = folding_module._bmp_fold_table()
    flagged = table >= folding_module._MAY_CHANGE
    for char in ("\u0301", "\u1100", "\u1161", "\u11a8", "\u212b", "\uf900", "\u0cd5", "\ud800"):
        assert flagged[ord(char)], hex(ord(char))  # accents, jamo, singletons, a vowel sign
    assert not flagged[[ord(c) for c in "가힣a,. 1!한"]].any()
    assert (table[~flagged] == folding_module.fold_table()[:0x10000][~flagged]).all()
    plain = np.flatnonzero(~flagged)
    rng = np.random.default_rng(0)
    for sample in rng.choice(plain, size=(2000, 6)):
        text = "".join(map(chr, sample))
        assert unicodedata.is_normalized("NFC", text), [hex(c) for c in sample]


def test_sorted_hashes_find_every_equal_pair():
    rng = np.random.default_rng(0)
    for size in (5000, 1, 0):
        values = rng.integers(0, 1 << 64, size, dtype=np.uint64, endpoint=False)
        hashes = np.sort(np.concatenate([values, values[: size // 10]]))  # some repeated
        lookup = hashing_module.SortedHashes(hashes)
        queries = np.concatenate([values[::3], rng.integers(0, 1 << 64, 50, dtype=np.uint64)])
        which, where = lookup.find(queries)
        expected = [(i, j) for i, v in enumerate(queries.tolist())
                    for j in np.flatnonzero(hashes == v).tolist()]  # fmt: skip
        assert list(zip(which.tolist(), where.tolist(), strict=True)) == expected


def test_distinct_is_unique():
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 3000):
        values = rng.integers(-5, 50, size)
        assert hashing_module.distinct(values).tolist() == np.unique(values).tolist()


def test_normalise():
    assert normalise("Hello, WORLD!  한국어  띄어 쓰기…") == "helloworld한국어띄어쓰기"
    decomposed = unicodedata.normalize("NFD", "한국어")
    assert normalise(decomposed) == "한국어"  # NFC first


# ---------------------------------------------------------------------------------------------
# Run mode: between corpus and tokenizer on the demo world


def test_run_mode_finds_the_demo_plants_and_training_reads_the_clean_corpus(demo_run):
    out = demo_run / "decontam"
    planted = json.loads((demo_run / "demo" / "planted.json").read_text())
    kept_ids = {d["id"] for d in corpus_lib.iter_corpus(demo_run / "corpus")}
    survivors = [p for p in planted if p["document_id"] in kept_ids]  # dedup may drop a few
    assert {p["plant_style"] for p in survivors} == set(demo.PLANT_STYLES)
    rows = status_of(out / "items.jsonl")
    dirty = {i for i, r in rows.items() if r["status"] == "dirty"}
    assert dirty == {p["item_id"] for p in survivors}
    copies: dict[str, set[str]] = {}
    for p in survivors:
        copies.setdefault(p["item_id"], set()).add(p["document_id"])
    for item_id, documents in copies.items():
        # an item lists up to decontam.max_documents of its mirrored copies, and only those
        listed = set(rows[item_id]["documents"])
        assert listed <= documents and len(listed) == min(len(documents), 5)
    assert max(r["coverage"] for i, r in rows.items() if i not in dirty) < 0.5
    # The decontaminated corpus: no planted document, every other one, and training reads it.
    assert run_facts.training_corpus_dir(demo_run) == out / "corpus"
    clean_ids = {d["id"] for d in corpus_lib.iter_corpus(out / "corpus")}
    flagged = (out / "flagged.jsonl").read_text().splitlines()
    dropped = {json.loads(line)["document"] for line in flagged}
    assert clean_ids == kept_ids - dropped
    assert {p["document_id"] for p in survivors} <= dropped
    stats = json.loads((out / "corpus" / "stats.json").read_text())  # the cleaned corpus's
    assert stats["documents_out"] == len(clean_ids)
    splits = ShardsManifest.read(demo_run / "shards" / ShardsManifest.FILE).splits
    assert splits["train"].documents + splits["val"].documents == len(clean_ids)
    assert run_facts.decontam_index(demo_run) is not None
    report = DecontamReport.read(out / DecontamReport.FILE)
    assert report.documents_dropped == len(dropped)


@pytest.fixture
def data_copy(demo_run, tmp_path) -> Path:
    return copy_data_run(demo_run, tmp_path / "run")


def test_cut_mode_removes_the_items_and_keeps_the_rest(data_copy):
    cfg = load_run_config(data_copy, values={"decontam.action": "cut"})
    report = run_stage("decontam", cfg, data_copy)
    assert report.documents_cut > 0
    index = run_facts.decontam_index(data_copy)
    texts = [d["text"] for d in corpus_lib.iter_corpus(data_copy / "decontam" / "corpus")]
    assert all(r["status"] == "clean" for r in index.check(texts))
    original = sum(1 for _ in corpus_lib.iter_corpus(data_copy / "corpus"))
    assert len(texts) == original - report.documents_dropped


def test_disabled_stage_trains_on_the_plain_corpus(data_copy):
    run = RunDir(data_copy)
    before = pipeline.current_fingerprint("tokenizer", load_run_config(data_copy), run)
    cfg = load_run_config(data_copy, values={"decontam.enabled": False})
    outcome = run_stage("decontam", cfg, data_copy)
    assert isinstance(outcome, NotNeeded) and outcome.reason.startswith("disabled")
    assert not (data_copy / "decontam").exists()
    assert run_facts.training_corpus_dir(data_copy) == data_copy / "corpus"
    # the tokenizer will be redone
    assert pipeline.current_fingerprint("tokenizer", cfg, run) != before
    assert run_facts.decontam_index(data_copy) is None


def test_run_mode_shards_and_merge(data_copy, cli):
    single = status_of(data_copy / "decontam" / "items.jsonl")
    for i in range(3):
        assert cli("decontam", "--run", data_copy, "--shard", f"{i}/3").code == 0
    assert cli("decontam", "merge", "--run", data_copy).code == 0
    assert status_of(data_copy / "decontam" / "items.jsonl") == single
    assert not (data_copy / "decontam-partial").exists()


# ---------------------------------------------------------------------------------------------
# Standalone: any training data, several machines


def test_standalone_shards_merge_to_the_single_scan(demo_world, tmp_path, cli, monkeypatch):
    world, paths = demo_world
    items = readers.read("demo_qa", paths["benchmark"])
    docs, _ = plant(items, [d["text"] for d in world.documents])
    for k in range(3):  # three files, one compressed with zstd
        chunk = docs[k::3]
        path = write_jsonl(tmp_path / f"d{k}.jsonl", chunk)
        if k == 2:
            (tmp_path / "d2.jsonl.zst").write_bytes(zstandard.compress(path.read_bytes()))
            path.unlink()
    bench = f"demo_qa={paths['benchmark']}"
    common = ["--corpus", tmp_path / "d*", "--benchmark", bench]
    # The single scan in two worker processes (small tasks so that both get work).
    monkeypatch.setattr(scan_module, "MB", 20_000)
    many_workers = ["--workers", "2", "--set", "decontam.batch_bytes=20000"]
    assert cli("decontam", *common, "--out", tmp_path / "one", *many_workers).code == 0
    for shards in (2, 5):  # by file, and by document when files are fewer than shards
        out = tmp_path / f"many{shards}"
        for i in range(shards):
            assert cli("decontam", *common, "--out", out, "--shard", f"{i}/{shards}").code == 0
        assert cli("decontam", "merge", "--out", out).code == 0
        one = tmp_path / "one" / "decontam"
        assert (out / "decontam/items.jsonl").read_text() == (one / "items.jsonl").read_text()
        merged = DecontamReport.read(out / "decontam" / DecontamReport.FILE)
        single = DecontamReport.read(one / DecontamReport.FILE)
        assert merged.benchmarks == single.benchmarks
        assert merged.documents_scanned == single.documents_scanned == len(docs)


def _outputs(folder: Path) -> dict:
    """What a decontam folder says, less its timing (and the corpus parts' contents)."""
    report = DecontamReport.read(folder / DecontamReport.FILE).to_json()
    report.pop("scan_seconds")
    out = {name: (folder / name).read_text() for name in ("items.jsonl", "flagged.jsonl")}
    out["report"] = report
    if (folder / "corpus").is_dir():
        stats = json.loads((folder / "corpus" / "stats.json").read_text())
        out["parts"] = [
            (p["path"], p["documents"], p["characters"],
             zstandard.decompress((folder / "corpus" / p["path"]).read_bytes(), 1 << 30))
            for p in stats["parts"]
        ]  # fmt: skip
    return out


def _mixed_inputs(world, tmp_path: Path) -> Path:
    """Planted documents in four files: with ids, without (named FILE:LINE), zstd, plain text."""
    items = readers.read("demo_qa", world[1]["benchmark"])
    docs, _ = plant(items, [d["text"] for d in world[0].documents])
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", docs[0::4])
    write_jsonl(folder / "b.jsonl", [{"text": d["text"]} for d in docs[1::4]])
    packed = write_jsonl(tmp_path / "c.jsonl", docs[2::4]).read_bytes()
    (folder / "c.jsonl.zst").write_bytes(zstandard.compress(packed))
    (folder / "d.txt").write_text("\n\n".join(d["text"] for d in docs[3::4]), encoding="utf-8")
    return folder


def test_one_and_two_workers_give_the_same_result(demo_world, tmp_path, cli, monkeypatch):
    folder = _mixed_inputs(demo_world, tmp_path)
    common = ["--corpus", folder / "*", "--benchmark", f"demo_qa={demo_world[1]['benchmark']}"]
    assert cli("decontam", *common, "--out", tmp_path / "whole", "--workers", "1").code == 0
    # Tasks of ~13 KB: the uncompressed JSONL files cut into byte ranges, small ones grouped.
    monkeypatch.setattr(scan_module, "MB", 200)
    files = sorted(folder.iterdir())
    tasks = scan_module.plan_tasks(files, 64 * scan_module.MB)
    assert len(tasks) > 4 and any(t.pieces[0].span for t in tasks)
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        assert cli("decontam", *common, "--out", out, "--workers", str(workers)).code == 0
    whole = _outputs(tmp_path / "whole" / "decontam")
    assert _outputs(tmp_path / "w1" / "decontam") == _outputs(tmp_path / "w2" / "decontam") == whole
    assert any(":" in line for line in whole["flagged.jsonl"].splitlines())  # b.jsonl:LINE
    assert whole["report"]["documents_flagged"] > 0


def test_run_mode_with_one_and_two_workers_gives_the_same_corpus(data_copy, monkeypatch):
    monkeypatch.setattr(scan_module, "MB", 200)  # a task per corpus part or two
    outputs = []
    for workers in (1, 2):
        cfg = load_run_config(
            data_copy, values={"decontam.action": "cut", "data_engine.workers": workers}
        )
        run_stage("decontam", cfg, data_copy, force=True)
        outputs.append(_outputs(data_copy / "decontam"))
    assert outputs[0] == outputs[1]
    assert outputs[0]["report"]["documents_cut"] > 0
    assert not (data_copy / "decontam-partial").exists()


def test_a_killed_scan_resumes_and_redoes_only_unfinished_tasks(demo_world, tmp_path, monkeypatch):
    folder = _mixed_inputs(demo_world, tmp_path)
    monkeypatch.setattr(scan_module, "MB", 200)
    cfg = load_config(
        values={
            "decontam.benchmarks": [f"demo_qa={demo_world[1]['benchmark']}"],
            "data_engine.workers": 1,
        }
    )
    # the tasks run in the data engine's process (a fork: the patch is there): they say which
    # tasks ran, and that the kill happened, in files
    ran_log, killed = tmp_path / "ran", tmp_path / "killed"
    real_run = scan_module.ScanPieces.run

    def killed_at_task_2(self, data=None, rank=0, world_size=1):
        with open(ran_log, "a") as f:
            f.write(f"{rank}\n")
        if rank == 2 and not killed.exists():
            killed.touch()
            raise RuntimeError("killed")
        return real_run(self, data, rank, world_size)

    def ran() -> list[int]:
        return [int(line) for line in ran_log.read_text().split()]

    monkeypatch.setattr(scan_module.ScanPieces, "run", killed_at_task_2)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="killed"):
        standalone(cfg, [str(folder / "*")], out)
    assert ran() == [0, 1, 2] and not (out / "decontam").exists()
    work = out / "decontam-partial" / "scan"
    first = (work / "scan" / "00000.npz").stat().st_mtime_ns
    ran_log.unlink()
    report = standalone(cfg, [str(folder / "*")], out)
    assert ran()[0] == 2 and 0 not in ran() and 1 not in ran()  # finished tasks are not redone
    assert not work.exists()
    fresh = tmp_path / "fresh"
    standalone(cfg, [str(folder / "*")], fresh)
    assert _outputs(out / "decontam") == _outputs(fresh / "decontam")
    assert report.documents_scanned > 0 and first > 0


def test_a_run_killed_after_writing_the_corpus_resumes(data_copy, monkeypatch):
    cfg = load_run_config(data_copy, values={"decontam.action": "cut"})
    run_stage("decontam", cfg, data_copy, force=True)
    done = _outputs(data_copy / "decontam")
    write_reports = outputs_module.write_reports

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(outputs_module, "write_reports", killed)
    shutil.rmtree(data_copy / "decontam")  # as on the first run
    with pytest.raises(RuntimeError, match="killed"):
        run_stage("decontam", cfg, data_copy)
    assert not (data_copy / "decontam").exists()
    work = data_copy / "decontam-partial" / "scan"
    assert list((work / "logs" / "write" / "completions").iterdir())  # the parts were written
    monkeypatch.setattr(outputs_module, "write_reports", write_reports)
    run_stage("decontam", cfg, data_copy)  # the tasks are complete: gathered, not redone
    assert _outputs(data_copy / "decontam") == done
    assert not work.exists()


def test_bad_inputs_are_user_errors(tmp_path, cli, demo_world):
    _, paths = demo_world
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "안녕하세요"}])
    good = f"demo_qa={paths['benchmark']}"

    def fails(*args, needle):
        result = cli("decontam", *args)
        assert result.code == 2, result.err
        assert needle in result.err, result.err
        assert "Traceback" not in result.err

    out = ["--out", tmp_path / "o"]
    fails("--corpus", data, *out, "--benchmark", "kobest_boolq", needle="TASK=PATH")
    fails("--corpus", data, *out, "--benchmark", "boolqq=x.tsv", needle="unknown benchmark")
    fails("--corpus", data, *out, "--benchmark", f"kobest_copa={tmp_path / 'no.tsv'}",
          needle="not found")  # fmt: skip
    fails("--corpus", tmp_path / "none*.jsonl", *out, "--benchmark", good, needle="matches no file")
    (tmp_path / "x.csv").write_text("a")
    fails("--corpus", tmp_path / "x.csv", *out, "--benchmark", good, needle="unsupported")
    fails("--corpus", data, *out, "--benchmark", good, "--shard", "3/2", needle="--shard")
    fails("--corpus", data, *out, "--benchmark", "demo_qa=demo", needle="demo world")
    fails("--corpus", data, *out, "--benchmark", good, "--set", "decontam.clean_threshold=0.9",
          needle="clean_threshold")  # fmt: skip
    fails(*out, needle="--corpus")
    fails("merge", "--out", tmp_path / "nothing", needle="no partial results")
    bad_col = tmp_path / "bad.tsv"
    bad_col.write_text("ID\tText\tAnswer\n1\t본문\tTrue\n")
    fails("--corpus", data, *out, "--benchmark", f"kobest_boolq={bad_col}", needle="question")
    # A missing shard is named.
    partial = tmp_path / "p"
    assert cli("decontam", "--corpus", data, "--out", partial, "--benchmark", good,
               "--shard", "0/2").code == 0  # fmt: skip
    fails("merge", "--out", partial, needle="1/2")
    assert not (tmp_path / "o" / "decontam").exists()  # nothing half-written


def test_merge_checks_every_partial_result_before_use(demo_world, tmp_path, cli):
    world, paths = demo_world
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": d["text"]} for d in world.documents[:40]])
    out = tmp_path / "o"
    common = ["--corpus", data, "--out", out, "--benchmark", f"demo_qa={paths['benchmark']}"]
    for i in range(2):
        assert cli("decontam", *common, "--shard", f"{i}/2").code == 0
    partial = out / "decontam-partial"
    arrays = partial / "shard-0001-of-0002.npz"
    good = arrays.read_bytes()

    def refused(*needles):
        result = cli("decontam", "merge", "--out", out)
        assert result.code == 2 and "Traceback" not in result.err, result.err
        for needle in needles:
            assert needle in result.err, result.err
        assert not (out / "decontam").exists()

    arrays.write_bytes(good[: len(good) // 2])
    refused("shard-0001-of-0002 is damaged", "bytes", "--shard 1/2")
    arrays.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    refused("checksum", "--shard 1/2")
    arrays.write_bytes(good)
    meta = partial / "shard-0000-of-0002.json"
    saved = meta.read_text()
    meta.write_text(saved[: len(saved) // 2])
    refused("shard-0000-of-0002.json cannot be read", "--shard 0/2")
    meta.write_text(saved)
    index = partial / "index.npz"
    index.write_bytes(index.read_bytes()[:100])
    refused("benchmark index", "run any one shard again")
    assert cli("decontam", *common, "--shard", "1/2").code == 0  # writes the index again
    assert cli("decontam", "merge", "--out", out).code == 0


def test_rerun_scans_again_when_the_cleaned_corpus_was_damaged(data_copy, cli):
    assert cli("decontam", "--run", data_copy).code == 0  # up to date for this folder
    part = sorted((data_copy / "decontam" / "corpus").glob("part-*.jsonl.zst"))[0]
    whole = part.read_bytes()
    part.unlink()  # a new file, not the one it may share with corpus/ (a hard link)
    part.write_bytes(whole[: len(whole) // 2])
    result = cli("decontam", "--run", data_copy)
    assert result.code == 0, result.err
    assert "making it again" in result.err
    assert part.read_bytes() == whole


def test_a_damaged_index_is_refused_by_readers_and_rebuilt_by_a_rerun(data_copy, cli):
    assert cli("decontam", "--run", data_copy).code == 0  # up to date for this folder
    index = data_copy / "decontam" / "index.npz"
    whole = index.read_bytes()
    index.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="decontamination index is damaged"):
        run_facts.decontam_index(data_copy)
    result = cli("decontam", "--run", data_copy)
    assert result.code == 0, result.err
    assert "index.npz cannot be read" in result.err and "making it again" in result.err
    assert run_facts.decontam_index(data_copy) is not None


def test_run_mode_without_corpus_is_a_user_error(tmp_path):
    cfg = load_config(values={"decontam.benchmarks": ["demo_qa=demo"]})
    with pytest.raises(UserError, match="no finished corpus"):
        run_stage("decontam", cfg, tmp_path / "empty")


def test_subprocess_exit_code(tmp_path):
    result = run_subprocess("decontam", "--corpus", tmp_path / "x*.txt", "--out", tmp_path,
                            "--benchmark", "jsonl=x.jsonl")  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "matches no file" in result.stderr


def test_run_mode_on_a_text_corpus_writes_the_demo_benchmark_it_needs(tmp_path):
    world = demo.build(size_mb=0.05, conversations=0)  # the recipe's benchmark
    leaked = demo.item_text(world.benchmark[3])
    (tmp_path / "in.txt").write_text(
        f"첫 문서입니다. 아무 관련 없는 글.\n\n{leaked}\n", encoding="utf-8"
    )
    cfg = load_config(
        values={
            "corpus.inputs": [str(tmp_path / "in.txt")],
            "corpus.min_chars": 5,
            "decontam.action": "drop",
        }
    )
    run_stage("corpus", cfg, tmp_path / "run")
    report = run_stage("decontam", cfg, tmp_path / "run")  # the demo recipe's demo_qa=demo
    assert report.benchmarks["demo_qa"].dirty == 1
    assert report.documents_dropped == 1


def test_planted_leaks_are_traced_to_the_source_that_carried_them(demo_world, tmp_path):
    """Two sources, leaks planted in each and one in both: every item names exactly the sources
    that held it; the action drops the wiki source's leaks only and keeps the web's."""
    world, paths = demo_world
    texts = [demo.item_text(item) for item in world.benchmark]
    planted = {"wiki": [*range(0, 8), 20], "web": [*range(8, 12), 20]}
    for name, items in planted.items():
        docs = [{"id": f"{name}-filler-{i}", "text": f"{name} 평범한 글 {i}번입니다. " * 4}
                for i in range(30)]  # fmt: skip
        docs += [{"id": f"{name}-leak-{i}", "text": f"{name}에 실린 글. {texts[i]}"} for i in items]
        write_jsonl(tmp_path / f"{name}.jsonl", docs)
    recipe = tmp_path / "mix.toml"
    recipe.write_text(
        "[corpus]\nmin_chars = 5\n"
        + "".join(
            f'[[corpus.sources]]\nname = "{name}"\ninputs = ["{tmp_path / name}.jsonl"]\n'
            for name in planted
        )
        + f'[decontam]\nbenchmarks = ["demo_qa={paths["benchmark"]}"]\naction = "drop"\n'
        + 'action_sources = ["wiki"]\n'
    )
    cfg = load_config(recipe)
    run = tmp_path / "run"
    run_stage("corpus", cfg, run)
    report = run_stage("decontam", cfg, run)
    rows = status_of(run / "decontam" / "items.jsonl")
    ids = [item["item_id"] for item in world.benchmark]
    for i, item_id in enumerate(ids):
        expected = sorted(name for name, items in planted.items() if i in items)
        assert rows[item_id]["sources"] == expected, (i, rows[item_id])
    assert report.by_source == {"demo_qa": {"web": 5, "wiki": 9}}
    assert report.action_sources == ["wiki"] and report.documents_dropped == 9
    kept = [d["id"] for d in corpus_lib.iter_corpus(run / "decontam" / "corpus")]
    assert not [k for k in kept if k.startswith("wiki-leak")]
    assert sorted(k for k in kept if k.startswith("web-leak")) == sorted(
        f"web-leak-{i}" for i in planted["web"]
    )
    md = (run / "decontam" / "report.md").read_text()
    assert "| benchmark | wiki | web |" in md and "| demo_qa | 9 | 5 |" in md
    flagged = [json.loads(line) for line in (run / "decontam" / "flagged.jsonl").open()]
    assert {f["corpus_source"] for f in flagged if f["document"].startswith("web")} == {"web"}


def test_an_action_on_a_source_the_corpus_does_not_have_is_refused():
    with pytest.raises(UserError, match=r"decontam\.action_sources names wikki, not a corpus"):
        load_config(values={"decontam.action_sources": ["wikki"]})


def test_a_cut_document_keeps_its_own_id_and_metadata(shared_data, tmp_path):
    """A source's ids and metadata (issue 51) go through the decontaminated corpus: the cut
    document is rewritten with its record's other fields as they were."""
    item = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")[0]
    filler = korquad_contexts(shared_data)[:20]
    rows = [{"id": f"d{i}", "url": f"https://x{i}.kr/", "text": t} for i, t in enumerate(filler)]
    leak = f"{filler[0][:300]}\n\n{item.overlap_text}\n\n{filler[1][:300]}"
    rows.append({"id": "leak", "url": "https://leak.kr/", "text": leak})
    web = write_jsonl(tmp_path / "web.jsonl", rows)
    source = {"name": "web", "inputs": [str(web)], "metadata": ["url"]}
    bench = f"kobest_boolq={shared_data / 'kobest/BoolQ/dev.tsv'}"
    cfg = load_config(values={"corpus.sources": [source], "corpus.min_chars": 1,
                              "decontam.benchmarks": [bench], "decontam.action": "cut"})  # fmt: skip
    run_dir = tmp_path / "run"
    pipeline.run_stage("corpus", cfg, run_dir)
    pipeline.run_stage("decontam", cfg, run_dir)
    docs = {d["id"]: d for d in corpus_lib.iter_corpus(run_dir / "decontam" / "corpus")}
    assert sorted(docs) == sorted(r["id"] for r in rows)
    assert docs["leak"]["metadata"] == {"url": "https://leak.kr/"}
    assert item.overlap_text not in docs["leak"]["text"]  # cut out, the rest kept
    assert all(d["metadata"]["url"].startswith("https://") for d in docs.values())


def test_a_benchmark_named_by_its_hf_id_is_read_as_eval_reads_it(tmp_path):
    """`kobest_boolq=hf:FOLDER:boolq:test`: the dataset repository's split (here a snapshot,
    the Hub's columns) is the benchmark decontam scans for, item for item what eval loads from
    the same id; a planted item is found, and two parts are always NAME and SPLIT."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hanlm.evals import tasks as tasks_lib

    repo = tmp_path / "kobest_v1"
    (repo / "boolq").mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: boolq\n  data_files:\n"
        "  - split: test\n    path: boolq/test-*\n---\n"
    )
    rows = [
        {"paragraph": f"{i}번 단락: 서울은 대한민국의 수도이며 한강이 도시를 가로지른다. " * 3,
         "question": f"{i}번 질문: 서울은 수도인가?", "label": i % 2}
        for i in range(6)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), repo / "boolq" / "test-00000-of-00001.parquet")
    spec = f"kobest_boolq=hf:{repo}:boolq:test"
    evaluated = tasks_lib.get("kobest_boolq").load(
        f"hf:{repo}:boolq:test", demo_files=None, options=tasks_lib.Options()
    )
    scanned = decontam_stage.load_items(decontam_stage.benchmark_specs([spec], None), "text")
    assert [i.fields for i in scanned] == [i.fields for i in evaluated] and len(scanned) == 6
    leak = rows[2]["paragraph"] + " " + rows[2]["question"]
    docs = [{"id": "leak", "text": "앞 문장. " + leak + " 뒤 문장."},
            {"id": "clean", "text": "부산은 항구 도시이고 바다가 가깝다. " * 20}]  # fmt: skip
    path = write_jsonl(tmp_path / "train.jsonl", docs)
    report = standalone(load_config(values={"decontam.benchmarks": [spec]}), [str(path)],
                        tmp_path / "o")  # fmt: skip
    assert report.benchmarks["kobest_boolq"].dirty == 1
    assert report.benchmarks["kobest_boolq"].clean == 5
    with pytest.raises(UserError, match="no split 'boolq'"):
        decontam_stage.benchmark_specs([f"kobest_boolq=hf:{repo}:boolq"], None)
