"""Chat data as sources: the three common shapes, renamed fields, rows that cannot be read
counted with examples, a weighted mix with repeats, local snapshots by hf:, and the config's
layout errors."""

from __future__ import annotations

import json

import pytest

from hanlm.config import SftSourceSection, load_config
from hanlm.data import chat_sources
from hanlm.errors import UserError
from hanlm.train.sft_data import split_heldout

MESSAGES = {"id": "m1", "messages": [
    {"role": "system", "content": "너는 친절한 도우미야."},
    {"role": "user", "content": "서울의 인구는?"}, {"role": "assistant", "content": "약 940만 명입니다."},
    {"role": "user", "content": "부산은?"}, {"role": "assistant", "content": "약 330만 명입니다."}]}  # fmt: skip
SHAREGPT = {"id": "s1", "system": "간결하게 답해.", "conversations": [
    {"from": "human", "value": "한국의 수도는?"}, {"from": "gpt", "value": "서울입니다."}]}  # fmt: skip
ALPACA = {"instruction": "다음 문장을 요약하라.", "input": "오늘은 비가 많이 왔다. 길이 젖었다.",
          "output": "비가 와서 길이 젖었다."}  # fmt: skip


def write(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return str(path)


def read(path, strict=False, **source):
    spec = SftSourceSection(name=source.pop("name", "src"), inputs=[str(path)], **source)
    return chat_sources.read_source(spec, strict=strict)


@pytest.mark.parametrize("fmt", ["auto", "explicit"])
def test_each_shape_becomes_the_same_messages(tmp_path, fmt):
    cases = {
        "messages": (MESSAGES, MESSAGES["messages"]),
        "sharegpt": (SHAREGPT, [{"role": "system", "content": "간결하게 답해."},
                                {"role": "user", "content": "한국의 수도는?"},
                                {"role": "assistant", "content": "서울입니다."}]),
        "alpaca": (ALPACA, [{"role": "user", "content": ALPACA["instruction"] + "\n\n" + ALPACA["input"]},
                            {"role": "assistant", "content": ALPACA["output"]}]),
    }  # fmt: skip
    for name, (row, expected) in cases.items():
        path = write(tmp_path / f"{name}.jsonl", [row])
        conversations, report = read(path, format="auto" if fmt == "auto" else name)
        assert conversations[0]["messages"] == expected
        assert report.format == name and report.detected == (fmt == "auto")
    conversations, _ = read(write(tmp_path / "a.jsonl", [ALPACA]))
    assert conversations[0]["id"] == "src:line-1"  # no id of its own: its place


def test_a_source_names_the_formats_keys_its_own_way(tmp_path):
    row = {
        "dialog": [{"speaker": "user", "text": "안녕?"}, {"speaker": "bot", "text": "안녕하세요!"}]
    }
    path = write(tmp_path / "d.jsonl", [row])
    with pytest.raises(UserError, match="holds no conversation"):
        read(path)  # the keys are no format's
    fields = {"conversations": "dialog", "from": "speaker", "value": "text"}
    with pytest.raises(UserError, match="unknown role 'bot'"):
        read(path, format="sharegpt", fields=fields)
    row["dialog"][1]["speaker"] = "assistant"
    conversations, _ = read(write(tmp_path / "d.jsonl", [row]), format="sharegpt", fields=fields)
    assert [m["role"] for m in conversations[0]["messages"]] == ["user", "assistant"]


def test_rows_that_cannot_be_read_are_counted_with_examples(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps(MESSAGES, ensure_ascii=False), "{not json",
             json.dumps({"messages": [{"role": "narrator", "content": "x"}]}),
             json.dumps({"messages": [{"role": "user", "content": "질문만"}]}),
             json.dumps({"messages": [{"role": "user", "content": "a<|eot|>b"},
                                      {"role": "assistant", "content": "b"}]}), ""]  # fmt: skip
    path.write_text("\n".join(lines), "utf-8")
    conversations, report = read(path)
    assert [c["id"] for c in conversations] == ["src:m1"] and report.rows == 5
    assert dict(report.skipped) == {"corrupt_json": 1, "unknown_role": 1,
                                    "no_assistant_turn": 1, "template_token": 1}  # fmt: skip
    assert report.examples["unknown_role"] == [f"{path}:3: turn 0 has unknown role 'narrator'"]
    with pytest.raises(UserError, match="not valid JSON") as e:
        read(path, strict=True)
    assert e.value.where == f"{path}:2"


def test_a_json_array_and_a_snapshot_by_hf_id(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    array = tmp_path / "alpaca.json"
    array.write_text(json.dumps([ALPACA, ALPACA], ensure_ascii=False), "utf-8")
    conversations, report = read(array)
    assert len(conversations) == 2 and report.format == "alpaca"
    snapshot = tmp_path / "ko-chat" / "data"
    snapshot.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{**SHAREGPT, "id": f"s{i}"} for i in range(3)]),
                   snapshot / "train-00000-of-00001.parquet")  # fmt: skip
    conversations, report = read(f"hf:{tmp_path / 'ko-chat'}:train")
    assert [c["id"] for c in conversations] == ["src:s0", "src:s1", "src:s2"]
    assert report.format == "sharegpt"


def test_a_weighted_mix_repeats_a_small_source_and_never_holds_out_a_copy(tmp_path):
    big = write(tmp_path / "big.jsonl", [{**MESSAGES, "id": f"b{i}"} for i in range(30)])
    small = write(tmp_path / "small.jsonl", [{**SHAREGPT, "id": f"s{i}"} for i in range(5)])
    sources = [SftSourceSection(name="big", inputs=[big], weight=0.75),
               SftSourceSection(name="small", inputs=[small], weight=0.25)]  # fmt: skip
    mixed, reports = chat_sources.read_all(sources, strict=False, seed=0)
    assert reports["big"]["taken"] == 26 and reports["small"]["taken"] == 9  # of 35
    assert reports["small"]["epochs"] == 1.8
    small_ids = [c["id"] for c in mixed if c["id"].startswith("small:")]
    assert len(small_ids) == 9 and sum("#repeat2" in i for i in small_ids) == 4
    assert mixed == chat_sources.read_all(sources, strict=False, seed=0)[0]  # seeded
    train, heldout = split_heldout(mixed, 10, seed=0)
    held = {c["id"] for c in heldout}
    assert not any(c["id"].split("#repeat")[0] in held for c in train)
    assert all("#repeat" not in i for i in held)
    capped = [sources[0], sources[1].model_copy(update={"max_epochs": 1.5})]
    with pytest.raises(UserError, match=r"1\.80 epochs, past its max_epochs 1\.5"):
        chat_sources.read_all(capped, strict=False, seed=0)
    plain = [s.model_copy(update={"weight": None}) for s in sources]
    assert len(chat_sources.read_all(plain, strict=False, seed=0)[0]) == 35


def test_the_recipes_layout_errors(tmp_path):
    source = {"name": "a", "inputs": ["a.jsonl"]}
    recipe = tmp_path / "r.toml"
    recipe.write_text('[sft]\ndata = "x.jsonl"\n')
    replaced = load_config(recipe, values={"sft.sources": [source]}).sft  # the command line wins
    assert replaced.data is None and replaced.sources[0].name == "a"
    assert load_config(recipe, values={"sft.data": "y.jsonl"}).sft.data == "y.jsonl"
    with pytest.raises(UserError, match=r"sft\.data and \[\[sft\.sources\]\] are both set"):
        load_config(values={"sft.data": "x.jsonl", "sft.sources": [source]})
    with pytest.raises(UserError, match="have no weight while others do"):
        load_config(values={"sft.sources": [{**source, "weight": 1.0}, {**source, "name": "b"}]})
    with pytest.raises(UserError, match=r"sum to 0\.5"):
        load_config(values={"sft.sources": [{**source, "weight": 0.5}]})
    with pytest.raises(UserError, match="format"):
        load_config(values={"sft.sources": [{**source, "format": "openai"}]})
    assert load_config(values={"sft.data": "x.jsonl"}).sft.source_list()[0].inputs == ["x.jsonl"]
