import gzip
import json
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from conftest import assert_user_error, korquad_contexts, run_subprocess, write_jsonl
from hanlm.config import load_config
from hanlm.data import corpus
from hanlm.data.corpus import iter_corpus, normalise
from hanlm.errors import UserError
from hanlm.pipeline import run_stage

DOCS = [
    "대한민국의 수도는 서울이다. 서울은 한강을 끼고 있는 큰 도시이다.",
    "프랑스의 수도는 파리이다. 파리에는 오래된 건물이 많이 남아 있다.",
    "철수는 사과 3개를 샀고 영희는 사과 5개를 샀다. 모두 몇 개인가?",
    "오늘은 날씨가 맑아서 공원에 산책을 나가기로 했다. ㅋㅋㅋ 기분이 좋다.",
]


def make_cfg(tmp_path, inputs, **values):
    values = {"corpus.inputs": [str(i) for i in inputs], "corpus.min_chars": 10, **values}
    return load_config(
        values={**values, "corpus.near_dedup": values.get("corpus.near_dedup", False)}
    )


def texts(run_dir):
    return [d["text"] for d in iter_corpus(run_dir / "corpus")]


# --- normalisation ---------------------------------------------------------------------------


def test_nfc_composes_hangul_and_keeps_compatibility_jamo():
    decomposed = unicodedata.normalize("NFD", "한국어 문장")
    assert len(decomposed) > len("한국어 문장")
    assert normalise(decomposed) == "한국어 문장"
    # NFKC would turn compatibility jamo (ㅋ U+314B) into conjoining jamo and break ㅋㅋ.
    assert normalise("ㅋㅋ ㅎㅎ ㅠㅠ") == "ㅋㅋ ㅎㅎ ㅠㅠ"
    assert unicodedata.normalize("NFKC", "ㅋㅋ") != "ㅋㅋ"
    # Full-width forms stay as written (NFKC would fold them).
    assert normalise("ＡＢＣ１２３") == "ＡＢＣ１２３"


def test_control_characters_removed_tabs_and_newlines_kept():
    assert normalise("\ufeff가\x00나\x07다\t라\r\n마\x1b\x9f") == "가나다\t라\n마"
    assert normalise("  앞뒤 공백  \n") == "앞뒤 공백"


# --- readers ----------------------------------------------------------------------------------


def test_txt_blocks_and_lines(tmp_path):
    block = tmp_path / "blocks.txt"
    block.write_text(f"{DOCS[0]}\n둘째 줄도 같은 문서이다.\n\n\n{DOCS[1]}\n", encoding="utf-8")
    cfg = make_cfg(tmp_path, [block])
    run_stage("corpus", cfg, tmp_path / "r1")
    got = texts(tmp_path / "r1")
    assert got == [f"{DOCS[0]}\n둘째 줄도 같은 문서이다.", DOCS[1]]

    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    cfg = make_cfg(tmp_path, [lines], **{"corpus.doc_per_line": True})
    run_stage("corpus", cfg, tmp_path / "r2")
    assert texts(tmp_path / "r2") == DOCS


def test_jsonl_gz_zst_and_parquet(tmp_path):
    rows = [{"body": d, "id": f"doc{i}"} for i, d in enumerate(DOCS)]
    plain = write_jsonl(tmp_path / "in" / "a.jsonl", rows[:1])
    with gzip.open(tmp_path / "in" / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps(rows[1], ensure_ascii=False) + "\n")
    (tmp_path / "in" / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(
            (json.dumps(rows[2], ensure_ascii=False) + "\n").encode()
        )
    )
    pq.write_table(pa.table({"body": [rows[3]["body"]]}), tmp_path / "in" / "d.parquet")
    cfg = make_cfg(tmp_path, [tmp_path / "in" / "*"], **{"corpus.text_field": "body"})
    stats = run_stage("corpus", cfg, tmp_path / "run")
    assert texts(tmp_path / "run") == DOCS
    ids = [d["id"] for d in iter_corpus(tmp_path / "run" / "corpus")]
    assert ids[:3] == ["doc0", "doc1", "doc2"]
    assert stats.documents_out == 4 and plain.exists()


def test_compressed_parquet(tmp_path):
    raw = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": DOCS}), raw)
    (tmp_path / "t.parquet.gz").write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    run_stage("corpus", make_cfg(tmp_path, [tmp_path / "t.parquet.gz"]), tmp_path / "run")
    assert texts(tmp_path / "run") == DOCS


# --- cleaning and deduplication ---------------------------------------------------------------


def test_exact_duplicates_and_short_documents_counted(tmp_path):
    rows = [{"text": d} for d in DOCS]
    rows += [{"text": DOCS[0]}, {"text": DOCS[0]}, {"text": unicodedata.normalize("NFD", DOCS[1])}]
    rows += [{"text": "짧다"}, {"text": "   "}]
    stats = run_stage(
        "corpus", make_cfg(tmp_path, [write_jsonl(tmp_path / "x.jsonl", rows)]), tmp_path / "r"
    )
    # The NFD copy is a duplicate once normalised.
    assert stats.exact_duplicates == 3
    assert stats.too_short == 2
    assert stats.documents_in == 9 and stats.documents_out == 4
    assert stats.characters_out == sum(len(d) for d in DOCS)
    assert texts(tmp_path / "r") == DOCS


def test_personal_data_is_replaced_counted_and_shown_where_a_source_asks(tmp_path):
    """corpus.pii (on by default) replaces personal data in the documents kept, counts each kind
    in stats.json with examples of the text after it; a source may turn it off."""
    contact = "자세한 문의는 담당자 010-2345-6789 또는 help.desk@naver.com 으로 연락 바랍니다."
    web = write_jsonl(tmp_path / "web.jsonl", [{"text": f"{DOCS[0]} {contact}"},
                                               {"text": f"{DOCS[1]} 주민번호 900101-1234567"}])  # fmt: skip
    forum = write_jsonl(tmp_path / "forum.jsonl", [{"text": f"{DOCS[2]} {contact}"}])
    sources = [{"name": "web", "inputs": [str(web)]},
               {"name": "forum", "inputs": [str(forum)], "pii": False}]  # fmt: skip
    cfg = load_config(values={"corpus.sources": sources, "corpus.min_chars": 10})
    stats = run_stage("corpus", cfg, tmp_path / "r")
    got = texts(tmp_path / "r")
    assert (
        got[0]
        == f"{DOCS[0]} 자세한 문의는 담당자 010-0000-0000 또는 email@example.com 으로 연락 바랍니다."
    )
    assert got[1] == f"{DOCS[1]} 주민번호 000000-0000000"
    assert got[2] == f"{DOCS[2]} {contact}"  # pii = false for this source
    assert {k: v.replaced for k, v in stats.pii.items() if v.replaced} == {
        "email": 1, "mobile": 1, "resident_number": 1}  # fmt: skip
    assert stats.pii["mobile"].replacement == "010-0000-0000"
    [example] = stats.pii["mobile"].examples
    assert "010-0000-0000" in example and "2345" not in example
    assert stats.sources["web"].pii_replaced == 3 and stats.sources["forum"].pii_replaced == 0
    assert "010-2345-6789" not in (tmp_path / "r" / "corpus" / "stats.json").read_text()


def test_near_duplicates_removed_distinct_kept(tmp_path, shared_data):
    contexts = korquad_contexts(shared_data)[:60]
    near = [c[:-3] + "입니다." for c in contexts[:10]]  # last characters changed
    respaced = [c.replace(" ", "", 3) for c in contexts[10:15]]  # Korean spacing varies
    rows = [{"text": t} for t in contexts + near + respaced]
    path = write_jsonl(tmp_path / "k.jsonl", rows)
    stats = run_stage(
        "corpus", make_cfg(tmp_path, [path], **{"corpus.near_dedup": True}), tmp_path / "r"
    )
    distinct = len(set(contexts))
    assert stats.near_duplicates == 15
    assert stats.documents_out == distinct


def test_corrupt_lines_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"text": DOCS[0]}, ensure_ascii=False).encode()
    path.write_bytes(
        good
        + b"\n{not json\n"
        + b'{"text": "\xff\xfe broken"}\n'
        + b'{"other": 1}\n'
        + b'{"text": 5}\n'
        + b"[1, 2]\n\n"
        + json.dumps({"text": DOCS[1]}, ensure_ascii=False).encode()
    )
    stats = run_stage("corpus", make_cfg(tmp_path, [path]), tmp_path / "r")
    assert stats.skipped == {"corrupt_json": 1, "invalid_utf8": 1, "missing_field": 3}
    assert texts(tmp_path / "r") == DOCS[:2]


def test_invalid_utf8_in_txt_drops_only_that_document(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(DOCS[0].encode() + b"\n\n\xc3\x28 \xed\x95\n\n" + DOCS[1].encode() + b"\n")
    stats = run_stage("corpus", make_cfg(tmp_path, [path]), tmp_path / "r")
    assert stats.skipped == {"invalid_utf8": 1}
    assert texts(tmp_path / "r") == DOCS[:2]


def test_truncated_compressed_file_counted(tmp_path):
    data = gzip.compress(("\n".join(json.dumps({"text": d}) for d in DOCS * 50)).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    stats = run_stage("corpus", make_cfg(tmp_path, [tmp_path / "cut.jsonl.gz"]), tmp_path / "r")
    assert stats.skipped.get("corrupt_file") == 1


def _jsonl_bytes(docs) -> bytes:
    return "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs).encode()


def _truncated_zst(path, docs):
    """A zstd file cut short mid-frame, as an interrupted download leaves it."""
    data = zstandard.ZstdCompressor().compress(_jsonl_bytes(docs))
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def test_truncated_zst_next_to_a_good_file_is_counted_and_warned(tmp_path, cli):
    good = write_jsonl(tmp_path / "in" / "good.jsonl", [{"text": d} for d in DOCS[:2]])
    cut = _truncated_zst(tmp_path / "in" / "cut.jsonl.zst", DOCS[2:] * 30)
    run = tmp_path / "run"
    result = cli("corpus", "--run", run, "--input", good, "--input", cut)
    assert result.code == 0, result.err
    assert "warning" in result.err and "cut.jsonl.zst is damaged" in result.err
    assert "truncated" in result.err
    stats = corpus.CorpusStats.read(run / "corpus" / corpus.CorpusStats.FILE)
    assert stats.skipped == {"corrupt_file": 1}
    [damaged] = stats.damaged_files
    assert damaged["path"] == str(cut) and "truncated" in damaged["error"]
    assert texts(run)[:2] == DOCS[:2]


def test_truncated_zst_under_strict_is_an_error_and_writes_nothing(tmp_path, cli):
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": d} for d in DOCS])
    cut = _truncated_zst(tmp_path / "cut.jsonl.zst", DOCS * 30)
    run = tmp_path / "run"
    result = cli("corpus", "--run", run, "--input", good, "--input", cut, "--strict")
    assert_user_error(result, str(cut), "truncated", "--strict")
    assert not (run / "corpus").exists() and not (run / "corpus.incomplete").exists()


def test_damaged_file_alone_names_the_damage(tmp_path, cli):
    cut = _truncated_zst(tmp_path / "cut.jsonl.zst", DOCS * 30)
    result = cli("corpus", "--run", tmp_path / "run", "--input", cut)
    assert_user_error(result, "empty", "1 damaged input files", str(cut), "zstd -t")
    assert not (tmp_path / "run" / "corpus").exists()


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("garbage.jsonl.zst", lambda data: b"not zstd at all" + data),
        ("flipped.jsonl.zst", lambda data: data[:-4] + bytes(b ^ 0xFF for b in data[-4:])),
        ("crc.jsonl.gz", lambda data: data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]),
        ("cut.jsonl.gz", lambda data: data[: len(data) // 2]),
        ("cut.txt.gz", lambda data: data[: len(data) // 2]),
        ("cut.parquet.zst", lambda data: data[: len(data) // 2]),
    ],
)
def test_every_kind_of_damaged_compressed_input_is_caught(tmp_path, name, damage):
    docs = DOCS * 30
    if ".parquet" in name:
        pq.write_table(pa.table({"text": docs}), tmp_path / "raw.parquet")
        raw = (tmp_path / "raw.parquet").read_bytes()
    elif ".txt" in name:
        raw = "\n\n".join(docs).encode()
    else:
        raw = _jsonl_bytes(docs)
    compressed = (
        gzip.compress(raw)
        if name.endswith(".gz")
        else zstandard.ZstdCompressor(write_checksum=True).compress(raw)
    )
    path = tmp_path / name
    path.write_bytes(damage(compressed))
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": DOCS[0] + " 좋은 파일"}])
    stats = run_stage("corpus", make_cfg(tmp_path, [good, path]), tmp_path / "r")
    assert stats.skipped.get("corrupt_file") == 1
    assert [d["path"] for d in stats.damaged_files] == [str(path)]
    with pytest.raises(UserError, match="cannot be read to its end"):
        run_stage(
            "corpus", make_cfg(tmp_path, [good, path], **{"corpus.strict": True}), tmp_path / "s"
        )


def test_concatenated_zstd_frames_and_gzip_members_are_read_whole(tmp_path):
    frames = b"".join(zstandard.compress(_jsonl_bytes([d])) for d in DOCS[:2])
    (tmp_path / "frames.jsonl.zst").write_bytes(frames)
    members = b"".join(gzip.compress(_jsonl_bytes([d])) for d in DOCS[2:])
    (tmp_path / "members.jsonl.gz").write_bytes(members)
    inputs = [tmp_path / "frames.jsonl.zst", tmp_path / "members.jsonl.gz"]
    stats = run_stage("corpus", make_cfg(tmp_path, inputs), tmp_path / "r")
    assert texts(tmp_path / "r") == DOCS
    assert stats.skipped == {} and stats.damaged_files == []


# --- bad inputs: exit 2, no traceback, nothing written ---------------------------------------


def test_strict_fails_with_location_and_writes_nothing(tmp_path, cli):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps({"text": DOCS[0]}).encode() + b"\n{oops\n")
    run = tmp_path / "run"
    result = cli("corpus", "--run", run, "--input", path, "--strict")
    assert_user_error(result, f"{path}:2", "corrupt json")
    assert not (run / "corpus").exists()
    assert not (run / "corpus.incomplete").exists()
    assert not (run / "config.toml").exists()


def test_empty_result_is_a_user_error(tmp_path, cli):
    path = write_jsonl(tmp_path / "short.jsonl", [{"text": "짧"}, {"text": "음"}])
    result = cli("corpus", "--run", tmp_path / "run", "--input", path)
    assert_user_error(result, "empty")
    assert not (tmp_path / "run" / "corpus").exists()


def test_missing_input_and_unsupported_type(tmp_path, cli):
    assert_user_error(
        cli("corpus", "--run", tmp_path / "r", "--input", tmp_path / "no*.txt"), "matches no file"
    )
    (tmp_path / "data.csv").write_text("a,b\n")
    assert_user_error(
        cli("corpus", "--run", tmp_path / "r", "--input", tmp_path / "data.csv"),
        "unsupported",
        ".jsonl",
    )
    assert not (tmp_path / "r").exists()


def test_missing_parquet_column_names_the_columns(tmp_path, cli):
    pq.write_table(pa.table({"content": DOCS}), tmp_path / "t.parquet")
    result = cli("corpus", "--run", tmp_path / "r", "--input", tmp_path / "t.parquet")
    assert_user_error(result, "no column 'text'", "content")


def test_hf_offline_and_bad_id(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = make_cfg(tmp_path, ["hf:someone/korean-corpus:train"])
    with pytest.raises(UserError, match="offline") as e:
        run_stage("corpus", cfg, tmp_path / "r")
    assert "hf download someone/korean-corpus" in e.value.message
    assert "hf:DIR:train" in e.value.message  # the downloaded folder, in the same spelling
    with pytest.raises(UserError, match="bad Hugging Face dataset id"):
        run_stage("corpus", make_cfg(tmp_path, ["hf:onlyname"]), tmp_path / "r")


def test_hf_without_datasets_package(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(UserError, match=r"hanlm\[hf\]"):
        run_stage("corpus", make_cfg(tmp_path, ["hf:someone/x:train"]), tmp_path / "r")


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    result = run_subprocess(
        "corpus", "--run", tmp_path / "r", "--input", tmp_path / "missing.jsonl"
    )
    assert_user_error(result, "matches no file")


# --- completion and re-runs -------------------------------------------------------------------


def test_complete_stage_is_skipped_and_config_change_redoes(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": d} for d in DOCS])
    cfg = make_cfg(tmp_path, [path])
    run_stage("corpus", cfg, tmp_path / "r")
    marker = tmp_path / "r" / "corpus" / "stage.json"
    before = marker.stat().st_mtime_ns
    run_stage("corpus", cfg, tmp_path / "r")
    assert marker.stat().st_mtime_ns == before
    stats = run_stage(
        "corpus", make_cfg(tmp_path, [path], **{"corpus.min_chars": 35}), tmp_path / "r"
    )
    assert marker.stat().st_mtime_ns != before
    assert stats.too_short == sum(len(d) < 35 for d in DOCS)


def test_rerun_rebuilds_a_finished_corpus_whose_part_was_damaged(tmp_path, cli):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": d} for d in DOCS])
    run = tmp_path / "r"
    assert cli("corpus", "--run", run, "--input", path).code == 0
    [part] = corpus.corpus_parts(run / "corpus")
    record = corpus.CorpusStats.read(run / "corpus" / corpus.CorpusStats.FILE).parts[0]
    assert record["size"] == part.stat().st_size and len(record["sha256"]) == 64
    part.write_bytes(part.read_bytes()[:10])
    result = cli("corpus", "--run", run, "--input", path)
    assert result.code == 0, result.err
    assert "is damaged" in result.err and "making it again" in result.err
    assert texts(run) == DOCS


def test_parts_split_by_characters(tmp_path, shared_data):
    contexts = korquad_contexts(shared_data)
    path = write_jsonl(tmp_path / "k.jsonl", [{"text": t} for t in contexts])
    cfg = make_cfg(tmp_path, [path], **{"corpus.part_chars": 50_000})
    stats = run_stage("corpus", cfg, tmp_path / "r")
    assert len(stats.parts) == len(list((tmp_path / "r" / "corpus").glob("part-*.jsonl.zst")))
    assert len(stats.parts) >= 10
    assert sum(p["documents"] for p in stats.parts) == stats.documents_out
    assert stats.documents_out + stats.exact_duplicates + stats.too_short == len(contexts)
