"""SFT of a model hanlm did not make: a Qwen2-shaped model with its own ChatML tokenizer (no
special_tokens.json, no generation block). Its template's tokens are read from the template,
the assistant's tokens are found turn by turn, and the export keeps its tokenizer and template
unchanged and loads in transformers."""

from __future__ import annotations

import json

import pytest
from foreign_models import chats, qwen2_model

from conftest import write_jsonl
from hanlm.config import load_config
from hanlm.pipeline import run_stage


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_qwen2_shaped_model_is_fine_tuned_with_its_own_template(tmp_path, method):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = qwen2_model(tmp_path / "qwen")
    data = write_jsonl(tmp_path / "chat.jsonl", chats())
    cfg = load_config(values={
        "sft.model": str(base), "sft.data": str(data), "sft.method": method,
        "sft.max_steps": 3, "sft.heldout": 4, "sft.seq_len": 128, "sft.compare": [],
        "decontam.enabled": False,
    })  # fmt: skip
    summary = run_stage("sft", cfg, tmp_path / "run")
    assert summary.step == 3
    audit = json.loads((tmp_path / "run" / "sft" / "audit.json").read_text())
    assert {t["name"]: t["token"] for t in audit["tokens"] if t["template"]} == {
        "system": "<|im_start|>", "user": "<|im_start|>", "assistant": "<|im_start|>",
        "eot": "<|im_end|>"}  # fmt: skip
    out = tmp_path / "run" / "sft" / "hf"
    assert (out / "chat_template.jinja").read_text() == (base / "chat_template.jinja").read_text()
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    assert not (out / "special_tokens.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    tok = AutoTokenizer.from_pretrained(out)
    ends = tok.convert_ids_to_tokens(model.generation_config.eos_token_id)
    assert ends == ["<|im_end|>", "<|endoftext|>"]  # a turn ends, or the text: as Qwen's own


@pytest.mark.slow
def test_lora_on_the_foreign_model_under_two_rank_fsdp2(tmp_path):
    """The same model under FSDP2 on 2 CPU ranks (its own Qwen2DecoderLayers the units)."""
    import os
    import subprocess
    import sys

    base = qwen2_model(tmp_path / "qwen")
    data = write_jsonl(tmp_path / "chat.jsonl", chats())
    settings = {"sft.max_steps": 3, "sft.heldout": 4, "sft.seq_len": 128, "sft.batch_rows": 4,
                "sft.method": "lora", "decontam.enabled": "false", "parallel.mode": "fsdp"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hanlm", "sft", "--run-dir", str(tmp_path / "run"), "--model", str(base),
           "--data", str(data), "--set", "sft.compare=[]"]  # fmt: skip
    for key, value in settings.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "sft" / "summary.json").read_text())
    assert summary["step"] == 3
    assert (tmp_path / "run" / "sft" / "hf" / "adapter").is_dir()
    out = tmp_path / "run" / "sft" / "hf"
    assert (out / "chat_template.jinja").read_text() == (base / "chat_template.jinja").read_text()


def test_a_model_that_needs_its_own_code_is_refused_before_any_work(tmp_path, cli):
    from conftest import assert_user_error

    base = qwen2_model(tmp_path / "custom")
    config = json.loads((base / "config.json").read_text())
    config.update(model_type="my_custom", architectures=["MyCustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_my.MyConfig",
                            "AutoModelForCausalLM": "modeling_my.MyCustomForCausalLM"})  # fmt: skip
    (base / "config.json").write_text(json.dumps(config))
    (base / "modeling_my.py").write_text("raise SystemExit('remote code ran')\n")
    data = write_jsonl(tmp_path / "chat.jsonl", chats())
    result = cli("sft", "--run-dir", tmp_path / "run", "--model", base, "--data", data,
                 "--set", "decontam.enabled=false")  # fmt: skip
    assert_user_error(result, "needs its own Python code to load", "runs no model's code")
    assert not (tmp_path / "run" / "sft" / "stage.json").exists()
