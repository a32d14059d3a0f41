"""hanlm.chat.template_base: hanlm's template and its four tokens added to a base model that has
no chat template; the embedding grows only where it has no spare rows, ties are kept, the base's
own rows are untouched, and the new rows are the same on every run."""

from __future__ import annotations

import json

import pytest
from foreign_models import llama_model, qwen2_model

from hanlm.chat import template_base
from hanlm.chat_template import CHAT_TEMPLATE
from hanlm.errors import UserError


def _without_template(folder):
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_tied_model_grows_keeps_its_tie_and_its_rows(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = _without_template(qwen2_model(tmp_path / "qwen"))
    rows = len(AutoTokenizer.from_pretrained(base))
    added = template_base.add_template(base, tmp_path / "out", seed=0)
    assert added.tokens == template_base.TEMPLATE_TOKENS
    assert (added.rows_before, added.rows_after) == (rows, rows + 4)
    assert template_base.read_added(tmp_path / "out") == added
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.convert_tokens_to_ids("<|eot|>") == rows + 3
    assert tok("<|eot|>", add_special_tokens=False).input_ids == [rows + 3]  # one token, special
    before = _weights(base)["model.embed_tokens.weight"]
    after = model.get_input_embeddings().weight.detach()
    assert after[:rows].equal(before)
    # the model's own initialisation (std 0.02), not a mean of the trained rows
    assert 0.005 < after[rows:].std().item() < 0.05
    again = template_base.add_template(base, tmp_path / "again", seed=0)
    assert again == added
    assert _weights(tmp_path / "again")["model.embed_tokens.weight"].equal(after)


def test_spare_rows_take_the_new_tokens_without_growing(tmp_path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    base = llama_model(tmp_path / "llama")
    config = json.loads((base / "config.json").read_text())
    spare = config["vocab_size"] + 8  # as Qwen's and Llama 3's padded embeddings have
    model = LlamaForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(spare, mean_resizing=False)
    model.save_pretrained(base)
    added = template_base.add_template(base, tmp_path / "out", seed=0)
    assert (added.rows_before, added.rows_after) == (spare, spare)
    assert "spare rows" in added.line()
    assert len(AutoTokenizer.from_pretrained(tmp_path / "out")) == spare - 4


def test_a_tokenizer_without_an_eos_cannot_take_the_template(tmp_path):
    from transformers import AutoTokenizer

    base = llama_model(tmp_path / "llama")
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("eos_token", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="no eos token"):
        template_base.check_can_add(AutoTokenizer.from_pretrained(base), str(base))
    with pytest.raises(UserError, match="no eos token"):
        template_base.add_template(base, tmp_path / "out", seed=0)
    assert not (tmp_path / "out").exists()
