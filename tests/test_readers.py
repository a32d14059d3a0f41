"""Benchmark readers: the KoBEST TSV release and the Hugging Face layout give the same items."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_jsonl
from hanlm.data import demo
from hanlm.errors import UserError
from hanlm.evals import readers

KOBEST = {
    "kobest_boolq": ("BoolQ", 700),
    "kobest_copa": ("COPA", 500),
    "kobest_hellaswag": ("HellaSwag", 500),
    "kobest_sentineg": ("SentiNeg", 400),
    "kobest_wic": ("WiC", 610),
}

# The Hugging Face skt/kobest_v1 column names of each task, from the normalised fields.
HF_ROWS = {
    "kobest_boolq": lambda f: {"paragraph": f["paragraph"], "question": f["question"],
                               "label": f["label"]},
    "kobest_copa": lambda f: dict(f),
    "kobest_hellaswag": lambda f: {"context": f["context"], "label": f["label"],
                                   **{f"ending_{i + 1}": e for i, e in enumerate(f["endings"])}},
    "kobest_sentineg": lambda f: dict(f),
    "kobest_wic": lambda f: dict(f),
}  # fmt: skip


@pytest.mark.parametrize("task", list(KOBEST))
def test_kobest_tsv_and_hf_layouts_agree(task, shared_data, tmp_path):
    folder, rows = KOBEST[task]
    items = readers.read(task, shared_data / "kobest" / folder / "dev.tsv")
    assert len(items) == rows
    assert all(i.benchmark == task and i.overlap_text for i in items)
    assert len({i.item_id for i in items}) == rows
    # The HF layout has no ID column: ids are 0-based row numbers, fields identical.
    hf = write_jsonl(tmp_path / "hf.jsonl", [HF_ROWS[task](i.fields) for i in items])
    again = readers.read(task, hf)
    assert [i.fields for i in again] == [i.fields for i in items]
    assert [i.overlap_text for i in again] == [i.overlap_text for i in items]
    assert [i.item_id for i in again] == [str(k) for k in range(rows)]


def test_kobest_field_values(shared_data):
    copa = readers.read("kobest_copa", shared_data / "kobest/COPA/dev.tsv")
    first = copa[0]  # ID 1: 전쟁이 시작되었다 / 결과 / Answer 2
    assert first.item_id == "1" and first.fields["question"] == "결과"
    assert first.fields["label"] == 1  # TSV Answer 2 -> 1
    assert first.overlap_text == "전쟁이 시작되었다.\n병사들이 전투에 파견되었다."
    hella = readers.read("kobest_hellaswag", shared_data / "kobest/HellaSwag/dev.tsv")
    assert hella[0].item_id == "0"  # no ID column: row index
    assert len(hella[0].fields["endings"]) == 4 and hella[0].fields["label"] in range(4)
    wic = readers.read("kobest_wic", shared_data / "kobest/WiC/dev.tsv")
    assert wic[0].fields["word"] == "실정" and "[실정]" in wic[0].fields["context_1"]
    assert "[" not in wic[0].overlap_text and wic[0].parts[0].startswith("백제는")
    boolq = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")
    assert {i.fields["label"] for i in boolq} == {0, 1}
    train = readers.read("kobest_sentineg", shared_data / "kobest/SentiNeg/train.tsv")
    assert {i.fields["label"] for i in train} == {0, 1}  # columns read by name, not position


def test_parquet_and_csv_layouts(shared_data, tmp_path):
    items = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")[:20]
    rows = [HF_ROWS["kobest_boolq"](i.fields) for i in items]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet")
    assert [i.fields for i in readers.read("kobest_boolq", tmp_path / "b.parquet")] == [
        i.fields for i in items
    ]
    import csv

    with open(tmp_path / "b.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["paragraph", "question", "label"])
        writer.writeheader()
        writer.writerows(rows)
    assert [i.fields for i in readers.read("kobest_boolq", tmp_path / "b.csv")] == [
        i.fields for i in items
    ]


def test_gsm8k_ko(shared_data, tmp_path):
    items = readers.read("gsm8k_ko", shared_data / "gsm8k-ko/test_first300.jsonl")
    assert len(items) == 300 and items[0].fields["target"] == "18"
    assert items[0].fields["question"].startswith("제넷의 오리는")  # Korean preferred
    plain = write_jsonl(
        tmp_path / "g.jsonl",
        [
            {"question": "사과 3개와 4개를 더하면?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "1,000원짜리 두 개는?", "answer": "모두 2,000원입니다."},
        ],
    )
    got = readers.read("gsm8k_ko", plain)
    assert [i.fields["target"] for i in got] == ["7", "2000"]
    assert got[0].overlap_text == "사과 3개와 4개를 더하면?\n3 + 4 = 7\n#### 7"


def test_ifeval_demo_and_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "if.jsonl",
        [{"key": 1001, "prompt": "세 문장으로 답하세요.", "instruction_id_list": ["length"],
          "kwargs": [{"num_sentences": 3}]}],
    )  # fmt: skip
    (item,) = readers.read("ifeval_ko", path)
    assert item.item_id == "1001" and item.fields["kwargs"] == [{"num_sentences": 3}]
    world = demo.build(size_mb=0.05, benchmark_items=10, conversations=0)
    paths = demo.write(world, tmp_path / "demo")
    items = readers.read("demo_qa", paths["benchmark"])
    assert [i.item_id for i in items] == [b["item_id"] for b in world.benchmark]
    assert items[0].overlap_text == demo.item_text(world.benchmark[0])
    assert isinstance(items[0].fields["answer"], bool)
    texts = write_jsonl(tmp_path / "t.jsonl", [{"body": "가나다"}, {"body": "라마바"}])
    assert [i.fields["text"] for i in readers.read("jsonl", texts, text_field="body")] == [
        "가나다",
        "라마바",
    ]


def test_parse_spec():
    assert readers.parse_spec("kobest_boolq=data/dev.tsv") == ("kobest_boolq", "data/dev.tsv")
    for bad in ("kobest_boolq", "=x", "kobest_boolq="):
        with pytest.raises(UserError, match="TASK=PATH"):
            readers.parse_spec(bad)
    with pytest.raises(UserError, match="unknown benchmark 'boolq'"):
        readers.parse_spec("boolq=x.tsv")


def test_bad_inputs_name_file_line_and_source(tmp_path):
    with pytest.raises(UserError, match="not found") as e:
        readers.read("kobest_boolq", tmp_path / "missing.tsv")
    assert "KoBEST_datarepo" in str(e.value)
    with pytest.raises(UserError, match="unknown benchmark"):
        readers.read("kobest_nope", tmp_path / "x.tsv")
    tsv = tmp_path / "copa.tsv"
    tsv.write_text(
        "ID\tsentence\tquestion\t1\t2\tAnswer\n1\t비가 왔다.\t결과\t젖었다.\t말랐다.\t3\n"
    )
    with pytest.raises(UserError, match="'Answer' has 3") as e:
        readers.read("kobest_copa", tsv)
    assert f"{tsv}:2" in str(e.value)
    tsv.write_text("ID\tsentence\tAnswer\n1\t비가 왔다.\t1\n")
    with pytest.raises(UserError, match="missing column 'question'"):
        readers.read("kobest_copa", tsv)
    tsv.write_text("ID\tText\tQuestion\tAnswer\n1\t글\t질문\n")
    with pytest.raises(UserError, match="columns"):
        readers.read("kobest_boolq", tsv)
    bad_json = tmp_path / "b.jsonl"
    bad_json.write_text('{"question": "q", "answer": "1"}\n{broken\n')
    with pytest.raises(UserError, match="not a JSON line") as e:
        readers.read("gsm8k_ko", bad_json)
    assert f"{bad_json}:2" in str(e.value)
    dup = write_jsonl(tmp_path / "d.jsonl", [{"id": 1, "text": "a"}, {"id": 1, "text": "b"}])
    with pytest.raises(UserError, match="appears twice"):
        readers.read("jsonl", dup)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="no items"):
        readers.read("jsonl", empty)
    other = tmp_path / "x.xlsx"
    other.write_text("x")
    with pytest.raises(UserError, match="unsupported benchmark file type"):
        readers.read("jsonl", other)
