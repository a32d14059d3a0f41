"""SFT of a model hanlm did not make: a Qwen2-shaped model with its own ChatML tokenizer (no
special_tokens.json, no generation block). Its template's tokens are read from the template,
the assistant's tokens are found turn by turn, and the export keeps its tokenizer and template
unchanged and loads in transformers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from foreign_models import (
    KOREAN,
    chats,
    llama_model,
    pretrained_llama_model,
    qwen2_model,
    with_own_code,
)

from conftest import korquad_contexts, write_jsonl
from hanlm.config import load_config
from hanlm.pipeline import run_stage


def fine_tune(tmp_path, base, method: str, *, conversations: int = 40, pairs=None, **values):
    """Three steps of SFT of the model folder `base` on the built-in chats (or on `pairs`) into
    tmp_path/run."""
    data = write_jsonl(tmp_path / "chat.jsonl", chats(conversations, pairs))
    cfg = load_config(values={
        "sft.model": str(base), "sft.data": str(data), "sft.method": method,
        "sft.max_steps": 3, "sft.heldout": 4, "sft.seq_len": 128, "sft.compare": [],
        "decontam.enabled": False, **values,
    })  # fmt: skip
    return run_stage("sft", cfg, tmp_path / "run")


def outside_world(shared: Path) -> dict:
    """Text and chats from outside the repository (../shared/data): KorQuAD's Wikipedia
    sentences for the base's tokenizer and pretraining, KoBEST COPA's premises and right
    choices for the chats."""
    sentences = [s.strip() + "." for c in korquad_contexts(shared)[:60] for s in c.split(". ")]
    with open(shared / "kobest" / "COPA" / "train.tsv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))[:20]
    pairs = [(f"{r['sentence']} 이것의 {r['question']}는?", r[r["Answer"]]) for r in rows]
    return {"text": [s for s in sentences if len(s) > 10], "pairs": pairs, "vocab_size": 800}


@pytest.fixture(params=["built-in", "outside"])
def world(request) -> dict:
    """The text the foreign base and its chats are made of: the built-in sentences, or text that
    is not in the repository (skipped where ../shared/data is absent)."""
    if request.param == "built-in":
        return {"text": KOREAN, "pairs": None, "vocab_size": 300}
    return outside_world(request.getfixturevalue("shared_data"))


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_qwen2_shaped_model_is_fine_tuned_with_its_own_template(tmp_path, method, world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = qwen2_model(tmp_path / "qwen", text=world["text"], vocab_size=world["vocab_size"])
    assert fine_tune(tmp_path, base, method, pairs=world["pairs"]).step == 3
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


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_base_model_without_a_template_gets_hanlms(tmp_path, method):
    """A Llama-shaped base model whose tokenizer has no chat template: hanlm's template and its
    four tokens are added, the embedding and the untied head grow, the new rows start untrained
    and sft.init gives them their start; the export carries the grown vocabulary."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hanlm.chat_template import CHAT_TEMPLATE

    base = llama_model(tmp_path / "llama")
    rows = len(AutoTokenizer.from_pretrained(base))
    assert fine_tune(tmp_path, base, method).step == 3
    audit = json.loads((tmp_path / "run" / "sft" / "audit.json").read_text())
    by_name = {t["name"]: t for t in audit["tokens"]}
    assert {n: by_name[n]["token"] for n in ("system", "user", "assistant", "eot")} == {
        "system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>",
        "eot": "<|eot|>"}  # fmt: skip
    assert by_name["eod"]["token"] == "</s>" and by_name["bos"]["token"] == "<s>"
    # hanlm added the four: untrained by construction, so sft.init gave them their start
    assert audit["untrained_template_tokens"] == ["system", "user", "assistant", "eot"]
    assert by_name["eot"]["basis"] == "added to the vocabulary by hanlm"
    assert [by_name[n]["id"] for n in ("system", "user", "assistant", "eot")] == [
        rows,
        rows + 1,
        rows + 2,
        rows + 3,
    ]
    out = tmp_path / "run" / "sft" / "hf"
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE and len(tok) == rows + 4
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    if method == "full":
        assert model.get_input_embeddings().weight.shape[0] == rows + 4
        assert model.get_output_embeddings().weight.shape[0] == rows + 4
        assert not model.config.tie_word_embeddings
    # the base model's own rows came through: those of a token no conversation holds are
    # unchanged by LoRA (full SFT moves every row through the untied head's softmax)
    with safe_open(str(base / "model.safetensors"), "pt") as f:
        before = f.get_tensor("model.embed_tokens.weight")
    unk = tok.convert_tokens_to_ids("<unk>")
    after = model.get_input_embeddings().weight.detach()[:rows]
    if method == "lora":
        assert after[unk].equal(before[unk])
    chat = [{"role": "user", "content": "서울은?"}]
    prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>\n서울은?<|eot|>\n<|assistant|>\n"


def test_full_sft_with_muon(tmp_path):
    """[sft.optimizer] name = "muon": the blocks' matrices by Muon, the token rows by AdamW
    (where SFT's row step scale hooks), in the SFT and its compared variant (a LoRA variant is
    refused with the recipe: tests/unit/test_muon.py)."""
    base = qwen2_model(tmp_path / "qwen")
    compare = [{"init": "none"}]
    summary = fine_tune(
        tmp_path, base, "full", **{"sft.optimizer.name": "muon", "sft.compare": compare}
    )
    assert summary.step == 3
    by_variant = json.loads((tmp_path / "run" / "sft" / "summary.json").read_text())[
        "closure_by_variant"
    ]
    assert set(by_variant) == {"full-mean", "full-none"}


def test_a_base_model_without_a_template_or_an_eos_is_refused_before_any_work(tmp_path, cli):
    from conftest import assert_user_error

    base = llama_model(tmp_path / "llama")
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("eos_token", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    data = write_jsonl(tmp_path / "chat.jsonl", chats())
    result = cli("sft", "--run-dir", tmp_path / "run", "--model", base, "--data", data,
                 "--set", "decontam.enabled=false")  # fmt: skip
    assert_user_error(result, "no chat template and no eos token", "eos_token")
    assert not (tmp_path / "run" / "sft" / "stage.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family,method", [("qwen2", "lora"), ("llama", "full")])
def test_foreign_models_under_two_rank_fsdp2(tmp_path, family, method):
    """Both models under FSDP2 on 2 CPU ranks (their own decoder layers the units): ChatML's
    with LoRA; the template-less Llama fully, rank 0 adding hanlm's template while rank 1 waits."""
    import os
    import subprocess
    import sys

    base = (qwen2_model if family == "qwen2" else llama_model)(tmp_path / family)
    data = write_jsonl(tmp_path / "chat.jsonl", chats())
    settings = {"sft.max_steps": 3, "sft.heldout": 4, "sft.seq_len": 128, "sft.batch_rows": 4,
                "sft.method": method, "decontam.enabled": "false", "parallel.mode": "fsdp"}  # fmt: skip
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
    out = tmp_path / "run" / "sft" / "hf"
    assert (out / "adapter").is_dir() == (method == "lora")
    if family == "qwen2":
        assert (out / "chat_template.jinja").read_text() == (
            base / "chat_template.jinja"
        ).read_text()
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(out)
        assert model.get_output_embeddings().weight.shape[0] == 304  # 300 and the template's 4


def test_a_model_that_needs_its_own_code_is_refused_before_any_work(tmp_path, cli):
    from conftest import assert_user_error

    base = with_own_code(
        qwen2_model(tmp_path / "custom"), model_code="raise SystemExit('remote code ran')\n"
    )
    data = write_jsonl(tmp_path / "chat.jsonl", chats())
    result = cli("sft", "--run-dir", tmp_path / "run", "--model", base, "--data", data,
                 "--set", "decontam.enabled=false")  # fmt: skip
    assert_user_error(result, "needs its own Python code to load", "model.trust_remote_code")
    assert not (tmp_path / "run" / "sft" / "stage.json").exists()


def test_a_model_with_its_own_code_is_fine_tuned_when_the_recipe_trusts_it(tmp_path):
    """model.trust_remote_code: the tokenizer, config, the model built on the meta device and its
    weights all load through the folder's own classes; the export carries its code and loads."""
    from transformers import AutoModelForCausalLM

    base = with_own_code(qwen2_model(tmp_path / "custom"))
    assert fine_tune(tmp_path, base, "full", **{"model.trust_remote_code": True}).step == 3
    out = tmp_path / "run" / "sft" / "hf"
    assert (out / "modeling_my.py").read_text() == (base / "modeling_my.py").read_text()
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(model).__name__ == "MyCustomForCausalLM"


# the closure lesson's settings: enough steps for the template to be learned, and the new rows
# (the same initialisation as the rest at first) moving faster once sft.init gave them a start
LESSON = {
    "sft.max_steps": 40, "sft.heldout": 20, "sft.micro_batch": 8, "sft.batch_rows": 8,
    "sft.optimizer.lr": 1e-2, "sft.optimizer.warmup_steps": 4, "sft.new_token_lr_scale": 3.0,
    "sft.closure_max_tokens": 48,
}  # fmt: skip


def test_the_closure_lesson_holds_on_a_foreign_base(tmp_path, world):
    """A pretrained Llama-shaped base with no template: hanlm's four tokens are added, untrained.
    Initialised (sft.init mean, full SFT) its answers end; the field's setup (LoRA, the rows
    frozen and not initialised) ends none as a compared variant and is refused as the run's own
    before any work; sft.min_closure stops a run whose answers do not end."""
    from hanlm.errors import UserError

    base = pretrained_llama_model(tmp_path / "llama", text=world["text"],
                                  vocab_size=world["vocab_size"])  # fmt: skip
    fine_tune(tmp_path, base, "full", conversations=80, pairs=world["pairs"], **LESSON,
              **{"sft.compare": [{"method": "lora", "init": "none",
                                  "train_new_token_rows": False}]})  # fmt: skip
    by_variant = json.loads((tmp_path / "run" / "sft" / "summary.json").read_text())[
        "closure_by_variant"
    ]
    assert by_variant["full-mean"] >= 0.9 and by_variant["lora-none-frozen"] <= 0.1, by_variant
    closure = json.loads((tmp_path / "run" / "sft" / "closure.json").read_text())
    assert closure["end_token"] == "<|eot|>" and closure["init"] == "mean"
    with pytest.raises(UserError, match="were never trained, LoRA freezes their embedding rows"):
        fine_tune(tmp_path / "field", base, "lora", conversations=80, **LESSON,
                  **{"sft.init": "none", "sft.train_new_token_rows": False})  # fmt: skip
    assert not (tmp_path / "field" / "run" / "sft" / "stage.json").exists()
    # the gate names the end token the answers must reach: here the one hanlm added
    with pytest.raises(UserError, match=r"ended 0 of 4 held-out answers with <\|eot\|>"):
        fine_tune(tmp_path / "gated", base, "full", **{"sft.min_closure": 0.9,
                                                       "sft.closure_max_tokens": 1})  # fmt: skip
