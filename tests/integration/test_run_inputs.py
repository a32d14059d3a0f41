"""`hanlm run` checks every input of the stages it will run before the first one writes
anything: one error listing every missing or unreadable input, in seconds, exit 2, and the run
folder untouched; stages outside --from/--until, and stages already finished, are not asked."""

from __future__ import annotations

import json
import time

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
    assert_user_error(result, "8 input(s) of this run cannot be read")
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
