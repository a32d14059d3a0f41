"""The command-line flags made from the config models: every flag users had still sets the same
key to the same value, every flag's help carries its field's description, and bad values are
the config's own errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from conftest import assert_user_error
from hanlm.cli import commands
from hanlm.cli.config_flags import add_config_flags, expand, field_at, flag_name, flag_values
from hanlm.cli.parser import CONFIG_FLAGS, build_parser, parse_args
from hanlm.config import Config, load_config

DECODING = [
    (["--max-new-tokens", "9"], {"generate.max_new_tokens": 9}),
    (["--greedy"], {"generate.greedy": True}),
    (["--temperature", "0.5"], {"generate.temperature": 0.5}),
    (["--top-k", "3"], {"generate.top_k": 3}),
    (["--top-p", "0.5"], {"generate.top_p": 0.5}),
    (["--repetition-penalty", "1.2"], {"generate.repetition_penalty": 1.2}),
    (["--no-repeat-ngram-size", "3"], {"generate.no_repeat_ngram_size": 3}),
    (["--frequency-penalty", "0.5"], {"generate.frequency_penalty": 0.5}),
    (["--presence-penalty", "0.25"], {"generate.presence_penalty": 0.25}),
    (["--seed", "4"], {"generate.seed": 4}),
    (["--device", "cuda:1"], {"generate.device": "cuda:1"}),
]

# Every config flag of `hanlm` before the flags were made from the models (the hand-kept maps of
# cli.py), with the keys and values it set then.
OLD_FLAGS = [
    ("corpus", ["--input", "a.txt", "--input", "b/*.jsonl"], {"corpus.inputs": ["a.txt", "b/*.jsonl"]}),
    ("corpus", ["--text-field", "body"], {"corpus.text_field": "body"}),
    ("corpus", ["--doc-per-line"], {"corpus.doc_per_line": True}),
    ("corpus", ["--min-chars", "5"], {"corpus.min_chars": 5}),
    ("corpus", ["--near-dedup"], {"corpus.near_dedup": True}),
    ("corpus", ["--no-near-dedup"], {"corpus.near_dedup": False}),
    ("corpus", ["--strict"], {"corpus.strict": True}),
    ("tokenizer", ["--vocab-size", "1024"], {"tokenizer.vocab_size": 1024}),
    ("tokenizer", ["--sample-chars", "5000"], {"tokenizer.sample_chars": 5000}),
    ("shards", ["--workers", "3"], {"data_engine.workers": 3}),
    ("shards", ["--val-fraction", "0.1"], {"shards.val_fraction": 0.1}),
    ("pretrain", ["--preset", "tiny"], {"model.preset": "tiny"}),
    ("pretrain", ["--max-steps", "7"], {"pretrain.max_steps": 7}),
    # --max-tokens alone replaces the recipe's max_steps
    ("pretrain", ["--max-tokens", "9000"], {"pretrain.max_tokens": 9000, "pretrain.max_steps": None}),
    ("pretrain", ["--max-tokens", "9000", "--max-steps", "2"],
     {"pretrain.max_tokens": 9000, "pretrain.max_steps": 2}),
    ("pretrain", ["--precision", "fp32"], {"precision.mode": "fp32"}),
    ("pretrain", ["--parallel", "ddp"], {"parallel.mode": "ddp"}),
    ("pretrain", ["--resume", "never"], {"checkpoint.resume": "never"}),
    ("export", ["--checkpoint", "5", "--out", "x"], {}),
    ("preflight", ["--checkpoint-dir", "ck"], {"preflight.checkpoint_dir": "ck"}),
    ("preflight", ["--timeout", "5"], {"preflight.timeout_s": 5.0}),
    ("preflight", ["--json"], {}),
    ("eval", ["--model", "a", "--model", "b"], {"eval.models": ["a", "b"]}),
    ("eval", ["--task", "demo_qa", "--task", "kobest_boolq=x.tsv"],
     {"eval.tasks": ["demo_qa", "kobest_boolq=x.tsv"]}),
    ("eval", ["--contamination", "items.jsonl"], {"eval.contamination": "items.jsonl"}),
    ("eval", ["--limit", "3"], {"eval.limit": 3}),
    ("eval", ["--batch-size", "4"], {"eval.batch_size": 4}),
    ("eval", ["--dtype", "bf16"], {"eval.dtype": "bf16"}),
    ("eval", ["--device", "cpu"], {"eval.device": "cpu"}),
    ("eval", ["--num-fewshot", "2"], {"eval.num_fewshot": 2}),
    ("eval", ["--max-new-tokens", "9"], {"eval.max_new_tokens": 9}),
    ("decontam", ["--benchmark", "demo_qa=demo", "--benchmark", "kobest_boolq=dev.tsv"],
     {"decontam.benchmarks": ["demo_qa=demo", "kobest_boolq=dev.tsv"]}),
    ("decontam", ["--ngram", "13"], {"decontam.ngram": 13}),
    ("decontam", ["--action", "cut"], {"decontam.action": "cut"}),
    ("decontam", ["--workers", "2"], {"data_engine.workers": 2}),  # moved: the data engine
    ("decontam", ["--text-field", "body"], {"decontam.text_field": "body"}),
    ("decontam", ["merge", "--corpus", "c", "--out", "o", "--shard", "0/2"], {}),
    *[("generate", ["m", "--prompt", "x", *argv], keys) for argv, keys in DECODING],
    ("generate", ["m", "--prompt", "x", "--batch-size", "2"], {"generate.batch_size": 2}),
    *[("chat", ["m", *argv], keys) for argv, keys in DECODING],
    ("sft", ["--model", "hf"], {"sft.model": "hf"}),
    ("sft", ["--data", "chat.jsonl"], {"sft.data": "chat.jsonl"}),
    ("sft", ["--init", "mean-cov"], {"sft.init": "mean-cov"}),
    ("sft", ["--max-steps", "3"], {"sft.max_steps": 3}),
    ("sft", ["--resume", "never"], {"sft.checkpoint.resume": "never"}),
    ("plan", ["--preset", "1.3b"], {"model.preset": "1.3b"}),
    ("plan", ["--model-config", "cfg.json"], {"model.preset": "cfg.json"}),
    ("plan", ["--vocab-size", "32768"], {"tokenizer.vocab_size": 32768}),
    ("plan", ["--seq-len", "256"], {"pretrain.seq_len": 256}),
    ("plan", ["--micro-batch", "2"], {"pretrain.micro_batch": 2}),
    ("plan", ["--global-batch-tokens", "65536"], {"pretrain.global_batch_tokens": 65536}),
    ("plan", ["--gpu", "h100"], {"plan.gpu": "h100"}),
    ("plan", ["--gpus", "8"], {"plan.gpus": 8}),
    ("plan", ["--hosts", "2"], {"plan.hosts": 2}),
    ("plan", ["--precision", "fp8"], {"precision.mode": "fp8"}),
    ("plan", ["--parallel", "fsdp"], {"parallel.mode": "fsdp"}),
    ("plan", ["--activation-checkpointing"], {"parallel.activation_checkpointing": "full"}),
    ("plan", ["--activation-checkpointing", "selective"],
     {"parallel.activation_checkpointing": "selective"}),
    ("plan", ["--tokens", "22e9"], {"plan.tokens": 22e9}),
    ("plan", ["--price-per-gpu-hour", "0.4"], {"plan.price_per_gpu_hour": 0.4}),
    ("plan", ["--mfu", "0.4"], {"plan.mfu": 0.4}),
    ("plan", ["--inter-host-gbps", "100"], {"plan.inter_host_gbps": 100.0}),
]  # fmt: skip


@pytest.mark.parametrize(
    "command, argv, keys", OLD_FLAGS, ids=lambda x: x if isinstance(x, str) else None
)
def test_every_old_flag_sets_the_same_key_to_the_same_value(command, argv, keys):
    args = parse_args([command, *argv])
    values = commands.flag_values(args)
    assert values == keys
    assert [type(v) for v in values.values()] == [type(v) for v in keys.values()]
    load_config(values=values)  # and the configuration takes them


def test_the_table_covers_every_flag_users_had():
    old = {(command, arg) for command, argv, _ in OLD_FLAGS for arg in argv if arg[:2] == "--"}
    assert len(old) == 84  # 77 spellings of config flags (chat's decoding ones too) + 7 others


def test_non_config_arguments_keep_their_names():
    args = parse_args(["decontam", "merge", "--corpus", "c", "--shard", "0/2"])
    assert (args.merge, args.corpus, args.shard) == ("merge", ["c"], "0/2")
    args = parse_args(["export", "--checkpoint", "5", "--out", "x"])
    assert (args.checkpoint, str(args.out)) == ("5", "x")
    args = parse_args(["generate", "m", "--prompts", "p.txt", "--chat"])
    assert (str(args.model_dir), str(args.prompts_file), args.chat) == ("m", "p.txt", True)
    args = parse_args(["run", "--run-dir", "r", "--from", "corpus"])
    assert (str(args.run), args.from_stage) == ("r", "corpus")


def test_a_flag_not_given_leaves_the_key_to_the_configuration():
    for command in CONFIG_FLAGS:
        argv = [command, "m"] if command in ("generate", "chat", "serve", "publish") else [command]
        assert commands.flag_values(parse_args(argv)) == {}


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        parse_args([command, "--help"])
    assert exit.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", sorted(CONFIG_FLAGS))
def test_help_lists_each_generated_flag_with_its_description(command, capsys):
    text = _help(command, capsys)
    keys = expand(Config, CONFIG_FLAGS[command])
    assert keys
    for key in keys:
        field = field_at(Config, key)
        assert flag_name(key, field) + " " in text, key
        assert " ".join((field.description or "").split()) in text, key
    assert f"[{keys[0].split('.')[0]}] settings" in text


def test_a_bool_key_has_a_flag_for_each_value():
    args = parse_args(["generate", "m", "--no-exempt-special-tokens"])
    assert commands.flag_values(args) == {"generate.exempt_special_tokens": False}


def test_pipeline_only_keys_have_no_flag_but_keep_set(capsys):
    assert "--enabled" not in _help("decontam", capsys)
    assert "--fail-on-no-go" not in _help("preflight", capsys)
    with pytest.raises(SystemExit):
        parse_args(["chat", "m", "--batch-size", "2"])  # nothing to batch
    assert load_config(overrides=["decontam.enabled=false"]).decontam.enabled is False


def test_a_bad_flag_value_is_the_configs_error_naming_key_and_choices(cli, tmp_path):
    result = cli("decontam", "--run", tmp_path / "r", "--action", "burn")
    assert_user_error(result, "decontam.action", "'drop'", "'cut'", "'keep'", "burn")
    result = cli("corpus", "--run", tmp_path / "r", "--min-chars", "-4")
    assert_user_error(result, "corpus.min_chars", "the command-line option setting")


def test_a_parser_has_the_config_flags_of_the_command_it_was_built_for():
    """parse_args reads the command's name first and builds the parser with its flags alone."""
    argv = ["generate", "m", "--greedy"]
    assert commands.flag_values(parse_args(argv)) == {"generate.greedy": True}
    assert commands.flag_values(build_parser("generate").parse_args(argv)) == {
        "generate.greedy": True
    }
    with pytest.raises(SystemExit):  # no command named: no config flags
        build_parser().parse_args(argv)
    with pytest.raises(SystemExit):  # another command's
        build_parser("chat").parse_args(argv)


def test_top_level_help_imports_no_config_model():
    """`hanlm --help` lists the commands without building any model: it stays fast."""
    code = (
        "import sys\nfrom hanlm.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\nprint('pydantic' in sys.modules, 'hanlm.config' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False False"


class _Inner(BaseModel):
    every: int = Field(5, description="steps", json_schema_extra={"cli": {"flag": "inner-every"}})
    mode: Literal["a", "b"] = "a"


class _Outer(BaseModel):
    inner: _Inner = Field(default_factory=_Inner)
    switch: bool = Field(True, json_schema_extra={"cli": {"flag": False}})
    names: list[str] = Field(default_factory=list, json_schema_extra={"cli": {"flag": "name"}})


class _Root(BaseModel):
    outer: _Outer = Field(default_factory=_Outer)
    other: _Inner = Field(default_factory=_Inner)


def test_sections_inside_sections_get_flags_too():
    """The derivation follows whatever sections the config has, nested ones included."""
    assert expand(_Root, ["outer"]) == ["outer.inner.every", "outer.inner.mode", "outer.names"]
    assert expand(_Root, ["outer", "-outer.names", "other.mode"]) == [
        "outer.inner.every", "outer.inner.mode", "other.mode"
    ]  # fmt: skip
    parser = argparse.ArgumentParser()
    add_config_flags(parser, _Root, ["outer"])
    args = parser.parse_args(["--inner-every", "7", "--mode", "b", "--name", "x", "--name", "y"])
    assert flag_values(args) == {
        "outer.inner.every": 7, "outer.inner.mode": "b", "outer.names": ["x", "y"]
    }  # fmt: skip
    assert "[outer.inner] settings" in parser.format_help()
    with pytest.raises(argparse.ArgumentError, match="conflicting"):  # two keys, one spelling
        add_config_flags(argparse.ArgumentParser(), _Root, ["outer.inner.mode", "other.mode"])
