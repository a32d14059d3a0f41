"""Small models of other families, built in the test with their own BPE tokenizers (no network):
a Qwen2-shaped one whose chat template is ChatML (`<|im_start|>` / `<|im_end|>`, no generation
block), and a Llama-shaped base model with no chat template at all (`<s>`, `</s>`, `<unk>`), for
SFT and the audit on models hanlm did not make."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
]
KOREAN = [
    "서울은 대한민국의 수도이며 한강이 도시를 가로지른다.",
    "부산은 바다를 끼고 있는 항구 도시로 해운대가 유명하다.",
    "제주도는 화산섬이며 한라산이 섬의 가운데에 있다.",
    "한국어는 한글로 적으며 세종대왕이 한글을 만들었다.",
    "김치는 배추와 고춧가루로 담그는 한국의 전통 음식이다.",
    "user assistant system 질문 답변 안녕하세요 감사합니다",
]


def _byte_level_bpe(
    specials: list[str], vocab_size: int, unk: str | None = None, text: list[str] = KOREAN
):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `text` (the sentences above)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(text * 20 if text is KOREAN else text, trainer)
    return tok


def qwen2_tokenizer(
    folder: Path, *, template: str | None = CHATML, vocab_size: int = 400, text: list[str] = KOREAN
):
    """A byte-level BPE tokenizer with Qwen2's special tokens, trained on `text`, saved in
    `folder`."""
    from transformers import PreTrainedTokenizerFast

    tok = _byte_level_bpe(QWEN_SPECIALS, vocab_size, text=text)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIALS[1:],
    )  # fmt: skip
    if template is not None:
        fast.chat_template = template
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return fast


def qwen2_model(
    folder: Path, *, seed: int = 0, vocab_size: int = 400, text: list[str] = KOREAN
) -> Path:
    """A 2-layer Qwen2ForCausalLM (biased q/k/v, tied embeddings) with the ChatML tokenizer,
    saved as any Hugging Face model folder: safetensors weights, no hanlm file."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = qwen2_tokenizer(folder, vocab_size=vocab_size, text=text)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


OWN_CONFIG_CODE = """from transformers import Qwen2Config


class MyConfig(Qwen2Config):
    model_type = "my_custom"
"""
OWN_MODEL_CODE = """from transformers import Qwen2ForCausalLM

from .configuration_my import MyConfig


class MyCustomForCausalLM(Qwen2ForCausalLM):
    config_class = MyConfig
"""


def with_own_code(folder: Path, *, model_code: str = OWN_MODEL_CODE) -> Path:
    """The Qwen2-shaped model in `folder` made one of an architecture transformers does not
    ship: model_type `my_custom`, its config and model classes in the folder's own Python files,
    named by `auto_map` (as a Hub model with remote code names them)."""
    import json

    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="my_custom", architectures=["MyCustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_my.MyConfig",
                            "AutoModelForCausalLM": "modeling_my.MyCustomForCausalLM"})  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_my.py").write_text(OWN_CONFIG_CODE)
    (folder / "modeling_my.py").write_text(model_code)
    return folder


LLAMA_SPECIALS = ["<unk>", "<s>", "</s>"]


def llama_model(
    folder: Path, *, seed: int = 0, vocab_size: int = 300, text: list[str] = KOREAN
) -> Path:
    """A 2-layer LlamaForCausalLM (untied head) whose tokenizer adds `<s>` and has no chat
    template: a base model as most are published."""
    import torch
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = _byte_level_bpe(LLAMA_SPECIALS, vocab_size, unk="<unk>", text=text)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def pretrained_llama_model(
    folder: Path, *, steps: int = 150, vocab_size: int = 300, text: list[str] = KOREAN
) -> Path:
    """`llama_model`, then pretrained on `text` (the first five sentences above; each ending
    with `</s>`) with torch's own loop: a base that knows its text and has never seen a chat
    token (seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama_model(folder, vocab_size=vocab_size, text=text)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    documents = KOREAN[:5] * 40 if text is KOREAN else text
    data = torch.tensor([i for s in documents for i in tok(s)["input_ids"] + [tok.eos_token_id]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 65, (16,), generator=generator)
        batch = torch.stack([data[s : s + 64] for s in starts.tolist()])
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    return folder


def chats(count: int = 40, pairs: list[tuple[str, str]] | None = None) -> list[dict]:
    """Korean question-and-answer conversations: `pairs` (question, answer) in turn, or over
    the sentences above."""
    if pairs is not None:
        return [
            {"id": f"c{i}", "messages": [
                {"role": "user", "content": pairs[i % len(pairs)][0]},
                {"role": "assistant", "content": pairs[i % len(pairs)][1]}]}
            for i in range(count)
        ]  # fmt: skip
    return [
        {"id": f"c{i}", "messages": [
            {"role": "user", "content": KOREAN[i % 5] + " 다음 문장은?"},
            {"role": "assistant", "content": KOREAN[(i + 1) % 5]}]}
        for i in range(count)
    ]  # fmt: skip
