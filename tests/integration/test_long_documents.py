"""Issue 29: one huge document must not exhaust memory. The corpus stage cuts a document over
corpus.max_document_chars (or drops it), and the later stages hand the tokenizers library at most
shards.piece_chars characters at a time with the tokens of the whole text. Small documents with
lowered limits check the behaviour here; benchmarks/huge_document.py measures 200 MB."""

import json
import random

import numpy as np
import pytest

import leaks
from conftest import write_jsonl
from hanlm import demo, pipeline
from hanlm.config import load_config
from hanlm.data import shards
from hanlm.data import tokenizer as tokenizer_lib
from hanlm.data.corpus import iter_corpus
from hanlm.data.decontam import BenchmarkIndex
from hanlm.data.decontam import index as index_module
from hanlm.data.decontam.folding import normalise
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages import run_facts
from hanlm.stages.rundir import RunDir
from hanlm.stages.stage import declared_settings
from hanlm.testsets import readers

SYLLABLES = "가나다라마바사아자차카타파하고노도로모보소오조초한국서울대학교사람시간문제생각경제"


def korean_like(chars: int, seed: int, *, lines: bool = False) -> str:
    """Words of 1-4 syllables, a sentence end now and then; one line unless `lines`."""
    rng = random.Random(seed)
    words, size = [], 0
    while size < chars:
        word = "".join(rng.choices(SYLLABLES, k=rng.randint(1, 4)))
        if rng.random() < 0.1:
            word += "다." + ("\n" if lines and rng.random() < 0.3 else "")
        words.append(word)
        size += len(word) + 1
    return " ".join(words).replace("\n ", "\n")[:chars].strip()


SMALL = [korean_like(400, seed, lines=True) for seed in range(1, 40)]
HUGE = korean_like(60_000, 0)  # one line, like the 200 MB document


def config(tmp_path, **values):
    inputs = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": "huge", "text": HUGE}] + [{"id": f"s{i}", "text": t} for i, t in enumerate(SMALL)],
    )
    return load_config(
        values={
            "corpus.inputs": [str(inputs)],
            "corpus.near_dedup": False,
            "data_engine.workers": 1,
            "tokenizer.vocab_size": 512,
            "shards.val_fraction": 0.1,
            **values,
        }
    )


def test_the_corpus_cuts_a_document_over_the_limit_into_documents(tmp_path):
    run = tmp_path / "run"
    stats = run_stage("corpus", config(tmp_path, **{"corpus.max_document_chars": 7_000}), run)
    docs = list(iter_corpus(run / "corpus"))
    pieces = [d for d in docs if d["id"].startswith("huge#")]
    assert [d["id"] for d in pieces] == [f"huge#{k}" for k in range(1, len(pieces) + 1)]
    assert len(pieces) >= 60_000 // 7_000 + 1
    assert all(3_500 <= len(d["text"]) <= 7_000 for d in pieces[:-1])
    # cut at spaces (the text has no line break), whose whitespace the cleaning strips
    assert " ".join(d["text"] for d in pieces) == HUGE
    assert [d["text"] for d in docs if not d["id"].startswith("huge")] == SMALL
    assert stats.long_documents.model_dump() == {
        "documents": 1,
        "pieces": len(pieces),
        "max_chars": 7_000,
        "action": "split",
    }
    assert stats.documents_in == 1 + len(SMALL)
    assert stats.documents_out == len(SMALL) + len(pieces)


def test_a_document_over_the_limit_is_dropped_or_refused(tmp_path):
    values = {"corpus.max_document_chars": 7_000, "corpus.long_documents": "drop"}
    stats = run_stage("corpus", config(tmp_path, **values), tmp_path / "drop")
    assert [d["id"] for d in iter_corpus(tmp_path / "drop" / "corpus")] == [
        f"s{i}" for i in range(len(SMALL))
    ]
    assert stats.long_documents.documents == 1 and stats.long_documents.pieces == 0
    with pytest.raises(UserError, match=r"document 'huge' has 60,000 characters, more than "):
        run_stage("corpus", config(tmp_path, **values, **{"corpus.strict": True}), tmp_path / "s")


def test_the_long_document_settings_are_part_of_the_corpus_fingerprint():
    stage = pipeline.declaration("corpus")
    default = load_config("demo")
    for change in ({"max_document_chars": 0}, {"long_documents": "drop"}):
        changed = default.model_copy(update={"corpus": default.corpus.model_copy(update=change)})
        assert declared_settings(changed, stage) != declared_settings(default, stage)


def test_shards_encode_a_document_over_piece_chars_to_the_tokens_of_the_whole(tmp_path):
    """The document kept whole by the corpus stage (no limit) is encoded 1,000 characters at a
    time: the token files are those of encoding every document whole, as before."""
    run = tmp_path / "run"
    cfg = config(tmp_path, **{"corpus.max_document_chars": 0, "shards.piece_chars": 1_000})
    run_stage("corpus", cfg, run)
    run_stage("tokenizer", cfg, run)
    manifest = run_stage("shards", cfg, run)
    tok = run_facts.tokenizer(run)
    expected = {"train": [], "val": []}
    for i, doc in enumerate(iter_corpus(run / "corpus")):
        split = "val" if i == 0 or shards.is_val(doc["id"], cfg.run.seed, 0.1) else "train"
        expected[split].extend([*tok.encode(doc["text"]).ids, manifest.eod_id])
    assert len(HUGE) > 50 * 1_000 and any(len(t) > 1_000 for t in expected.values())
    for split, ids in expected.items():
        files = manifest.splits[split].files
        got = np.concatenate([np.fromfile(run / "shards" / f.path, np.uint16) for f in files])
        assert got.tolist() == ids
        assert manifest.splits[split].tokens == len(ids)
    sidecar = json.loads((run / "shards" / "part-00000.json").read_text())
    assert sidecar["val"]["bytes"] + sidecar["train"]["bytes"] == sum(
        len(t.encode()) for t in [HUGE, *SMALL]
    )
    # the piece length is no output setting: the stage is up to date with another one
    update = {"shards": cfg.shards.model_copy(update={"piece_chars": 1 << 20})}
    again = cfg.model_copy(update=update)
    assert pipeline.current_fingerprint("shards", again, RunDir(run)) == (
        pipeline.current_fingerprint("shards", cfg, RunDir(run))
    )


def test_the_tokenizer_trains_on_long_documents_in_pieces_to_the_same_vocabulary(monkeypatch):
    texts = [HUGE[:20_000], *SMALL]
    whole = tokenizer_lib.train(texts, 512, 2, 4).to_str()
    monkeypatch.setattr(tokenizer_lib, "TRAIN_PIECE_CHARS", 500)
    assert tokenizer_lib.train(texts, 512, 2, 4).to_str() == whole


def test_decontam_scans_a_long_text_in_windows_with_the_hits_of_the_whole(tmp_path, monkeypatch):
    """A text over LONG_TEXT_CHARS is scanned window by window: the same (unit, first place)
    hits as one scan of it, with items copied whole, respaced, without punctuation, in halves,
    across the windows' edges, and short items that count only as a whole segment."""
    world = demo.build(size_mb=0.05, benchmark_items=40, planted_fraction=0.0, conversations=2)
    items = readers.read("demo_qa", demo.write(world, tmp_path)["benchmark"])
    review = readers.Item("kobest_sentineg", "r1", {}, "최고네요", ("최고네요",), ())
    index = BenchmarkIndex.build([*items, review])
    rng = random.Random(0)
    filler = [d["text"] for d in world.documents[:150]]
    plants = [
        leaks.respace(items[0].overlap_text, rng),
        leaks.strip_punctuation(items[1].overlap_text),
        items[2].overlap_text[: len(items[2].overlap_text) // 2],
        *(item.overlap_text for item in items[3:8]),
        # a full stop after every word: every space is a place a window may end or start
        *(" ".join(w + "." for w in item.overlap_text.split()) for item in items[8:16]),
        # short item: a whole segment after a full stop, none after a space
        *(["가성비 최고네요.", "배송. 최고네요 진짜", "좋아요. 최고네요! 또"] * 10),
    ]
    for item in items[16:40]:  # copies of n to n + STRIDE - 2 characters: found on some grids
        norm = normalise(item.overlap_text)
        length = rng.randint(index_module.DEFAULT_NGRAM, index_module.DEFAULT_NGRAM + 2)
        at = rng.randint(0, len(norm) - length)
        plants.append(rng.choice(filler)[:40] + " " + norm[at : at + length] + ".")
    pieces = filler + plants
    rng.shuffle(pieces)
    text = " ".join(pieces)
    # none: after a space, the short item is no whole segment, wherever the windows are cut
    no_segment = " ".join(["가성비 최고네요."] * 600)
    texts = ["짧은 글. 최고네요", text, items[12].overlap_text, no_segment]
    whole, lengths = index.scan_texts(texts)
    assert 3 not in whole.documents
    rows = index.check(texts)
    assert len(set(whole.units.tolist())) >= 20 and len(text) > 15 * 1_500
    for size in (397, 1_499, 7_001):
        monkeypatch.setattr(index_module, "LONG_TEXT_CHARS", size)
        windowed, windowed_lengths = index.scan_texts(texts)
        for field in ("documents", "units", "positions"):
            assert getattr(windowed, field).tolist() == getattr(whole, field).tolist(), size
        assert windowed_lengths.tolist() == lengths.tolist()
        assert index.check(texts) == rows
