"""Another model's chat template: its special tokens read from the template, and the assistant's
tokens found turn by turn where it has no generation block."""

from __future__ import annotations

import pytest
from foreign_models import CHATML, qwen2_tokenizer

from hanlm.chat import foreign, tokens
from hanlm.data import chat_data
from hanlm.errors import UserError

CHAT = [
    {"role": "system", "content": "짧게 답하라."},
    {"role": "user", "content": "한국의 수도는?"},
    {"role": "assistant", "content": "서울이다."},
    {"role": "user", "content": "제주도에는 무엇이 있나?"},
    {"role": "assistant", "content": "한라산이 있다."},
]


def test_chatml_tokens_are_read_from_the_template(tmp_path):
    qwen2_tokenizer(tmp_path / "qwen")
    special = tokens.load_special_tokens(tmp_path / "qwen")  # no special_tokens.json there
    assert {k: special[k]["token"] for k in ("system", "user", "assistant", "eot", "eod", "pad")} == {
        "system": "<|im_start|>", "user": "<|im_start|>", "assistant": "<|im_start|>",
        "eot": "<|im_end|>", "eod": "<|endoftext|>", "pad": "<|endoftext|>"}  # fmt: skip
    assert "bos" not in special
    assert [r["token"] for r in special["reserved"]] == ["<|vision_start|>", "<|vision_end|>"]
    assert "do not use" in special["reference"] or "does not use" in special["reference"]


def test_the_assistants_tokens_and_their_end_are_trained_turn_by_turn(tmp_path):
    tok = qwen2_tokenizer(tmp_path / "qwen")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    ids, mask = chat_data.tokenize(tok, CHAT, eot)
    spans, current = [], []
    for token, trained in zip(ids, mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    assert [tok.decode(s) for s in spans] == ["서울이다.<|im_end|>", "한라산이 있다.<|im_end|>"]
    assert ids == tok.apply_chat_template(CHAT, tokenize=True, return_dict=False)


def test_templates_it_cannot_read_are_refused(tmp_path):
    rewriting = CHATML.replace(
        "message['content']", "message['content'] + (messages|length|string)"
    )
    tok = qwen2_tokenizer(tmp_path / "rewrites", template=rewriting)
    with pytest.raises(UserError, match="rewrites earlier turns"):
        chat_data.tokenize(tok, CHAT, tok.convert_tokens_to_ids("<|im_end|>"))
    plain = qwen2_tokenizer(
        tmp_path / "plain", template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    )
    with pytest.raises(UserError, match="no special token"):
        foreign.special_tokens_of(plain, "plain")
    bare = qwen2_tokenizer(tmp_path / "bare", template=None)
    with pytest.raises(UserError, match="has no chat template"):
        foreign.special_tokens_of(bare, "bare")


def test_a_template_without_a_system_role_gives_the_other_turns(tmp_path):
    no_system = (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    tok = qwen2_tokenizer(tmp_path / "gemma-like", template=no_system)
    special = foreign.special_tokens_of(tok, "gemma-like")
    assert "system" not in special and special["user"]["token"] == "<|im_start|>"
    assert special["eot"]["token"] == "<|im_end|>"
