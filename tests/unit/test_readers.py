"""Benchmark readers: the KoBEST TSV release and the Hugging Face layout give the same items,
the very text skt/kobest_v1's publisher built from the TSV (see docs/kobest.md)."""

from __future__ import annotations

import pytest

from conftest import KOBEST_FOLDERS, assert_user_error, kobest_as_published, write_jsonl
from hanlm import demo
from hanlm.errors import UserError
from hanlm.evals import tasks as tasks_lib
from hanlm.testsets import readers

SPLITS = ("train", "dev")
DEV_ROWS = {
    "kobest_boolq": 700,
    "kobest_copa": 500,
    "kobest_hellaswag": 500,
    "kobest_sentineg": 400,
    "kobest_wic": 610,
}


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("task", list(KOBEST_FOLDERS))
def test_kobest_tsv_reads_as_pandas_does(task, split, shared_data):
    """Every field of every row, against pandas read_csv(sep="\t").dropna() (the publisher's)."""
    pd = pytest.importorskip("pandas")
    tsv = shared_data / "kobest" / KOBEST_FOLDERS[task] / f"{split}.tsv"
    published = pd.read_csv(tsv, sep="\t").dropna()
    # the same parse with every column as text, so fields compare exactly (no int/bool typing)
    as_text = pd.read_csv(tsv, sep="\t", dtype=str).dropna()
    assert list(as_text.index) == list(published.index)
    rows = [row for _, row in readers._rows_tsv(tsv, drop_na=True)]
    assert len(rows) == len(as_text)
    for ours, theirs in zip(rows, as_text.to_dict("records"), strict=True):
        assert list(ours.values()) == list(theirs.values())


def _published_files(task, split, shared_data, folder) -> dict[str, object]:
    """skt/kobest_v1's split as its publisher built it, saved in each layout a user may have."""
    dataset = kobest_as_published(
        shared_data / "kobest" / KOBEST_FOLDERS[task] / f"{split}.tsv", task
    )
    files = {
        "jsonl": folder / f"{split}.jsonl",
        "json": folder / f"{split}.json",  # datasets writes JSON lines under this name too
        "parquet": folder / f"{split}.parquet",
        "csv": folder / f"{split}.csv",
    }
    dataset.to_json(files["jsonl"], force_ascii=False)
    dataset.to_json(files["json"])
    dataset.to_parquet(files["parquet"])
    dataset.to_csv(files["csv"])
    return files


@pytest.mark.parametrize("task", list(KOBEST_FOLDERS))
def test_kobest_tsv_and_published_hf_layouts_agree(task, shared_data, tmp_path):
    """Fields, ids and prompts from the TSV equal those from skt/kobest_v1 as published."""
    task_def = tasks_lib.get(task)
    for split in SPLITS:
        tsv = shared_data / "kobest" / KOBEST_FOLDERS[task] / f"{split}.tsv"
        items = readers.read(task, tsv)
        assert all(i.benchmark == task and i.overlap_text and i.parts for i in items)
        # ids: the row's position among the rows kept, in every layout (lm-eval's doc_id)
        assert [i.item_id for i in items] == [str(k) for k in range(len(items))]
        prompts = [(task_def.context(i.fields), task_def.choices(i.fields)) for i in items]
        golds = [task_def.gold(i.fields) for i in items]
        for layout, path in _published_files(task, split, shared_data, tmp_path).items():
            again = readers.read(task, path)
            assert [i.item_id for i in again] == [i.item_id for i in items], layout
            assert [i.fields for i in again] == [i.fields for i in items], layout
            assert [i.overlap_text for i in again] == [i.overlap_text for i in items], layout
            assert [i.parts for i in again] == [i.parts for i in items], layout
            assert [(task_def.context(i.fields), task_def.choices(i.fields)) for i in again] == (
                prompts
            ), layout
            assert [task_def.gold(i.fields) for i in again] == golds, layout
    assert (
        len(readers.read(task, shared_data / "kobest" / KOBEST_FOLDERS[task] / "dev.tsv"))
        == (DEV_ROWS[task])
    )


def test_kobest_quoting_gives_the_published_text(shared_data):
    """The fields pandas' quote handling changes (docs/kobest.md) come out as published."""
    boolq = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/train.tsv")
    assert boolq[44].fields["paragraph"].startswith("두근두근 내 인생은 같은 이름의 소설")
    assert boolq[3364].fields["paragraph"].startswith('신형과 "고전형"의 두 가지')
    hella = readers.read("kobest_hellaswag", shared_data / "kobest/HellaSwag/train.tsv")
    assert hella[528].fields["endings"][2] == (
        '가위를 사용하여 끈 끝부분을 거꾸로된 "v" 모양으로 자르면 더 전문가처럼 만들 수 있다.'
    )


def test_kobest_field_values(shared_data):
    copa = readers.read("kobest_copa", shared_data / "kobest/COPA/dev.tsv")
    first = copa[0]  # TSV ID 1: 전쟁이 시작되었다 / 결과 / Answer 2
    assert first.item_id == "0" and first.fields["question"] == "결과"
    assert first.fields["label"] == 1  # TSV Answer 2 -> 1
    assert first.overlap_text == "전쟁이 시작되었다.\n병사들이 전투에 파견되었다."
    hella = readers.read("kobest_hellaswag", shared_data / "kobest/HellaSwag/dev.tsv")
    assert hella[0].item_id == "0"
    assert len(hella[0].fields["endings"]) == 4 and hella[0].fields["label"] in range(4)
    wic = readers.read("kobest_wic", shared_data / "kobest/WiC/dev.tsv")
    assert wic[0].fields["word"] == "실정" and "[실정]" in wic[0].fields["context_1"]
    assert "[" not in wic[0].overlap_text and wic[0].parts[0].startswith("백제는")
    boolq = readers.read("kobest_boolq", shared_data / "kobest/BoolQ/dev.tsv")
    assert {i.fields["label"] for i in boolq} == {0, 1}
    train = readers.read("kobest_sentineg", shared_data / "kobest/SentiNeg/train.tsv")
    assert {i.fields["label"] for i in train} == {0, 1}  # columns read by name, not position


SENTINEG_HEADER = "ID\tText\tLabel\n"


def test_tsv_quoting_and_na_rows(tmp_path, capsys):
    """Quoted fields, doubled quotes and NA rows, as pandas reads them and the publisher kept."""
    tsv = tmp_path / "sentineg.tsv"
    tsv.write_text(
        SENTINEG_HEADER
        + '1\t"따옴표"는 벗겨진다\t1\n'  # quoted at the start: the quotes go
        + '2\t"탭\t그리고 ""인용"" 포함"\t0\n'  # a quoted tab stays text, "" is one "
        + '3\t가운데 "따옴표"는 남는다\t1\n'  # not at the start: literal
        + "4\tNA\t0\n"  # pandas NA string: row dropped
        + "5\t\t1\n"  # empty field: row dropped
        + '6\t"여러\n줄"\t0\n'  # a quoted line break; the record spans lines 7-8
        + "\n   \n"  # blank and spaces-only lines are skipped
        + "7\t N/A\t1\n"  # not exactly an NA string: kept
        + "8\tnull\t1",  # no final newline
        encoding="utf-8",
    )
    items = readers.read("kobest_sentineg", tsv)
    assert [i.fields["sentence"] for i in items] == [
        "따옴표는 벗겨진다",
        '탭\t그리고 "인용" 포함',
        '가운데 "따옴표"는 남는다',
        "여러\n줄",
        " N/A",
    ]
    assert [i.item_id for i in items] == ["0", "1", "2", "3", "4"]  # positions after the drop
    err = capsys.readouterr().err
    assert "left out 3 row(s)" in err and "lines 5, 6, 12" in err
    pd = pytest.importorskip("pandas")
    published = pd.read_csv(tsv, sep="\t").dropna()
    assert list(published["Text"]) == [i.fields["sentence"] for i in items]


def test_tsv_malformed_rows_name_file_and_line(tmp_path, cli):
    tsv = tmp_path / "sentineg.tsv"
    tsv.write_text(SENTINEG_HEADER + "1\t좋다\t1\n" + '2\t"둘\n째 줄"\t0\n' + "3\t셋\n")
    with pytest.raises(UserError, match="2 tab-separated columns, the header has 3") as e:
        readers.read("kobest_sentineg", tsv)
    assert f"{tsv}:5" in str(e.value)  # the line the bad record starts on, after a 2-line one
    tsv.write_text(SENTINEG_HEADER + "1\t좋다\t1\t\n")
    with pytest.raises(UserError, match="4 tab-separated columns") as e:
        readers.read("kobest_sentineg", tsv)
    assert f"{tsv}:2" in str(e.value)
    tsv.write_text(SENTINEG_HEADER + "1\t좋다\t1\n" + '2\t"닫히지 않는\t0\n3\t셋\t1\n')
    with pytest.raises(UserError, match="never closes") as e:
        readers.read("kobest_sentineg", tsv)
    assert f"{tsv}:3" in str(e.value)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "말뭉치 문서"}])
    result = cli(
        "decontam", "--corpus", corpus, "--out", tmp_path / "o",
        "--benchmark", f"kobest_sentineg={tsv}",
    )  # fmt: skip
    assert_user_error(result, f"{tsv}:3", "never closes")


def test_pandas_na_strings_are_pandas_own():
    parsers = pytest.importorskip("pandas._libs.parsers")
    assert readers.PANDAS_NA_STRINGS == parsers.STR_NA_VALUES


def test_csv_layout_with_line_breaks(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text(
        'paragraph,question,label\n"첫 줄\n둘째 줄, 쉼표",질문?,1\n문단,"""인용"" 질문",0\n',
        encoding="utf-8",
    )
    items = readers.read("kobest_boolq", path)
    assert [i.fields["paragraph"] for i in items] == ["첫 줄\n둘째 줄, 쉼표", "문단"]
    assert items[1].fields["question"] == '"인용" 질문'
    path.write_text("paragraph,question,label\n문단,질문\n", encoding="utf-8")
    with pytest.raises(UserError, match="2 comma-separated columns") as e:
        readers.read("kobest_boolq", path)
    assert f"{path}:2" in str(e.value)


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
    assert items[0].fields["choices"] == world.benchmark[0]["choices"]
    assert items[0].fields["answer"] == world.benchmark[0]["answer"] in (0, 1)
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


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"choices": "가"}, "choices"),
        ({"choices": ["가"]}, "choices"),
        ({"choices": ["가", ""]}, "choices"),
        ({"answer": 2}, "answer"),
        ({"answer": "예"}, "answer"),
    ],
)
def test_demo_qa_bad_items_say_which_field(tmp_path, change, message):
    item = {
        "item_id": "x",
        "passage": "글",
        "question": "물음?",
        "choices": ["가", "나"],
        "answer": 1,
    }
    path = write_jsonl(tmp_path / "b.jsonl", [{**item, **change}])
    with pytest.raises(UserError, match=message):
        readers.read("demo_qa", path)
