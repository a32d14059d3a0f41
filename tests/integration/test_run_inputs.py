"""`hanlm run` checks every input of the stages it will run before the first one writes
anything: one error listing every missing or unreadable input, in seconds, exit 2, and the run
folder untouched; stages outside --from/--until, and stages already finished, are not asked."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import DEMO_RUN_VALUES, assert_user_error, copy_data_run, write_jsonl
from hanlm.config import load_config
from hanlm.run_inputs import problems


def recipe(tmp_path, **sections) -> str:
    """A recipe file: the demo world's two sources plus what `sections` adds."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path = tmp_path / "recipe.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_every_missing_input_in_one_error_before_anything_is_written(tmp_path, cli):
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "한국어 문서 " * 10}])
    no_text = write_jsonl(tmp_path / "no_text.jsonl", [{"body": "한국어"}])
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    config = recipe(
        tmp_path,
        corpus={
            "inputs": [
                str(good),
                str(tmp_path / "none" / "*.jsonl"),
                str(no_text),
                str(tmp_path / "broken.parquet"),
                "hf:someone/korean-web:train",
                f"hf:{tmp_path}:train",
            ]
        },
        decontam={"benchmarks": [f"kobest_boolq={tmp_path / 'BoolQ' / 'test.tsv'}"]},
        sft={"data": str(tmp_path / "chat.jsonl"), "model": str(tmp_path / "no-model")},
    )
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = cli("run", "--run", run_dir, "--config", config)
    assert time.monotonic() - started < 30
    assert_user_error(result, "8 input(s) or setting(s) of this run cannot be used here")
    err = " ".join(result.err.split())
    for needle in ("none/*.jsonl' matches no file", "no string field 'text'", "broken.parquet",
                   "hf:someone/korean-web:train cannot be streamed", "hf download someone/korean-web",
                   "has no data files for split 'train'", "benchmark file for kobest_boolq not found",
                   "sft source 'chat' input", "matches no file", "no-model"):  # fmt: skip
        assert needle in err, needle
    assert "good.jsonl" not in err
    assert not run_dir.exists()  # nothing written, not even the folder


def test_only_the_stages_that_will_run_are_asked(demo_run, tmp_path, cli):
    cfg = load_config(values={**DEMO_RUN_VALUES, "sft.data": str(tmp_path / "chat.jsonl")})
    assert [p.split(":")[0] for p in problems(cfg, ["sft"])] == [
        f"sft source 'chat' input '{tmp_path}/chat.jsonl'"
    ]
    assert problems(cfg, ["corpus", "decontam", "tokenizer", "shards"]) == []
    # a finished data run whose raw inputs are gone: --until shards asks nothing of them
    run_dir = copy_data_run(demo_run, tmp_path / "run")
    args = ["run", "--run", run_dir, "--until", "shards"]
    for key, value in {**DEMO_RUN_VALUES, "sft.data": str(tmp_path / "chat.jsonl")}.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    assert cli(*args).code == 0
    result = cli(*[a if a != "shards" else "sft" for a in args])  # now SFT will run: asked
    assert_user_error(result, "chat.jsonl")


def _sentences(prefix: str, n: int) -> list[str]:
    return [
        f"{prefix} 게시글 {i}번: 오늘은 서울의 날씨가 맑았고 시장에는 사람들이 많았다. "
        f"우리는 {i}개의 사과를 샀고 저녁에는 가족과 함께 이야기를 나누었다." * 3
        for i in range(n)
    ]


def _sources_with_their_own_fields(tmp_path) -> tuple[str, dict]:
    """A recipe of three sources as Korean practitioners bring them, each with its own field
    names: a forum dump (JSONL, text in `body`, id in `post_id`), a FineWeb-2-shaped parquet file
    (text in `content`, id in `doc_key`) and a Wikipedia-shaped snapshot folder of a Hub dataset
    (hf:FOLDER:train, text in `article`, id in `page`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    forum = write_jsonl(
        tmp_path / "forum" / "posts.jsonl",
        [{"post_id": f"p{i}", "body": t} for i, t in enumerate(_sentences("포럼", 5))],
    )
    web = tmp_path / "web" / "part-0.parquet"
    web.parent.mkdir()
    texts = _sentences("웹", 5)
    pq.write_table(pa.table({"doc_key": [f"w{i}" for i in range(5)], "content": texts}), web)
    wiki = tmp_path / "wiki-snapshot"
    rows = [{"page": f"k{i}", "article": t} for i, t in enumerate(_sentences("위키", 5))]
    write_jsonl(wiki / "data" / "train-00000-of-00001.jsonl", rows)
    sources = {
        "forum": (str(forum), "body", "post_id"),
        "web": (str(web), "content", "doc_key"),
        "wiki": (f"hf:{wiki}:train", "article", "page"),
    }
    lines = ["[corpus]", "near_dedup = false", "min_chars = 20", "[corpus.quality]",
             "enabled = false"]  # fmt: skip
    for name, (spec, text, ident) in sources.items():
        lines += ["[[corpus.sources]]", f'name = "{name}"', f"inputs = [{json.dumps(spec)}]",
                  f'text_field = "{text}"', f'id_field = "{ident}"']  # fmt: skip
    path = tmp_path / "recipe.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path), sources


def test_each_source_is_checked_and_read_by_its_own_fields(tmp_path):
    """The up-front check and then the corpus stage read every source by its own text_field
    and id_field (the check used to read corpus.text_field, and `hanlm run` stopped at once)."""
    from hanlm.data.corpus import iter_corpus
    from hanlm.pipeline import run_stage

    config, _ = _sources_with_their_own_fields(tmp_path)
    cfg = load_config(config)
    assert problems(cfg, ["corpus"]) == []
    run_stage("corpus", cfg, tmp_path / "run", save_config=False)
    ids = {doc["id"] for doc in iter_corpus(tmp_path / "run" / "corpus")}
    assert {f"{p}{i}" for p in "pwk" for i in range(5)} <= ids


def test_a_source_whose_field_is_missing_is_named_with_its_file_and_field(tmp_path, cli):
    config, sources = _sources_with_their_own_fields(tmp_path)
    recipe_file = Path(config)
    text = recipe_file.read_text()
    for field in ("body", "content", "article"):
        text = text.replace(f'text_field = "{field}"', f'text_field = "{field}_x"')
    recipe_file.write_text(text)
    result = cli("run", "--run", tmp_path / "run", "--config", config)
    assert_user_error(result, "3 input(s) or setting(s) of this run cannot be used here")
    lines = [" ".join(line.split()) for line in result.err.split("  - ")[1:]]
    for (name, (spec, field, _)), line in zip(sources.items(), lines, strict=True):
        assert line.startswith(f"corpus source '{name}' input '{spec}'"), line
        assert f"'{field}_x'" in line and "text_field" in line, line
        where = "train-00000-of-00001.jsonl" if name == "wiki" else spec
        assert f"Where: {where}" in line or where in line, line
    assert "post_id, body" in lines[0] and "doc_key, content" in lines[1]
    assert not (tmp_path / "run").exists()


def test_a_setting_this_host_cannot_train_with_stops_before_the_first_stage(
    tmp_path, cli, monkeypatch
):
    """FP8 on a machine without it used to stop at pretraining, after the data stages; a
    `single` process under torchrun likewise. Both are known before the first stage."""
    cfg = load_config(values={"precision.mode": "fp8"})
    assert problems(cfg, ["corpus", "decontam", "tokenizer", "shards"]) == []  # no training
    [problem] = problems(cfg, ["pretrain"])
    assert "precision.mode 'fp8'" in problem and "compute capability 8.9" in problem
    assert "fp8-emulate" in problem  # the fix
    result = cli("run", "--run", tmp_path / "run", "--set", "precision.mode=fp8")
    assert_user_error(result, "FP8 needs", "Where: precision.mode")
    assert not (tmp_path / "run").exists()

    monkeypatch.setenv("WORLD_SIZE", "2")
    [problem] = problems(load_config(values={"parallel.mode": "single"}), ["sft"])
    assert "parallel.mode is single but torchrun started 2 processes" in problem
