import json
import unicodedata

import pytest

from conftest import assert_user_error, korquad_contexts
from hanlm.data import tokenizer
from hanlm.data.corpus import iter_corpus
from hanlm.errors import UserError
from hanlm.stages import tokenizer as tokenizer_stage

MIXED = [
    "대한민국의 수도는 서울이다.",
    "ㅋㅋㅋㅋ ㅎㅎ ㅠㅠ ㄱㄴㄷ ㅏㅑㅓ",  # compatibility jamo
    "韓國語 漢字 表記와 한글 混用",  # Hanja
    "Hello, World! naïve café — ＡＢＣ",
    "전화번호 010-1234-5678, 2024년 3월 15일, 3.14159, ½ ²",
    "이모지 😀👍🏽 👨‍👩‍👧 🇰🇷 끝",
    "탭\t두칸  전각\u3000공백\u00a0nbsp \n\n줄바꿈\r\n캐리지\r리턴 \u200b폭없는공백 ",
    "옛한글 ᄒᆞᆫ글 and 반각 ﾊﾝｸﾞﾙ",
    "",
    " 앞 공백과 뒤 공백 ",
]


@pytest.fixture(scope="module")
def hf_tokenizer(demo_run):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_run / "tokenizer")


def test_round_trip_is_exact(demo_run, hf_tokenizer):
    tok = tokenizer_stage.load(demo_run)
    for text in MIXED:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
        ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert hf_tokenizer.decode(ids) == text


def test_round_trip_on_real_text(demo_run, shared_data):
    tok = tokenizer_stage.load(demo_run)
    for text in korquad_contexts(shared_data)[:200]:
        text = unicodedata.normalize("NFC", text)
        assert tok.decode(tok.encode(text).ids) == text


def test_nfc_normaliser(demo_run):
    tok = tokenizer_stage.load(demo_run)
    text = "한국어 토크나이저"
    assert tok.encode(unicodedata.normalize("NFD", text)).ids == tok.encode(text).ids


def test_digits_split_one_by_one(demo_run):
    tok = tokenizer_stage.load(demo_run)
    tokens = tok.encode("12345").tokens
    assert tokens == ["1", "2", "3", "4", "5"]
    pieces = [tok.decode([i]) for i in tok.encode("가격은 98765원, 전화 010-2345").ids]
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert "".join(digit_pieces) == "98765010" + "2345"
    assert all(len(p) == 1 for p in digit_pieces)


def test_special_tokens_reserved_and_single(demo_run):
    spec = json.loads((demo_run / "tokenizer" / "special_tokens.json").read_text())
    tok = tokenizer_stage.load(demo_run)
    core = tokenizer.core_special_tokens()
    assert [spec[k]["id"] for k in core] == list(range(len(core)))
    assert spec["pad"]["id"] not in (spec["eod"]["id"], spec["eot"]["id"])
    for name, token in core.items():
        assert tok.encode(token).ids == [spec[name]["id"]]
    assert len(spec["reserved"]) >= 32
    assert spec["vocab_size"] % 64 == 0
    assert tok.get_vocab_size() == spec["vocab_size"] == 1024


def test_transformers_loads_it_with_chat_template(hf_tokenizer):
    assert hf_tokenizer.pad_token == "<|pad|>" and hf_tokenizer.eos_token == "<|endoftext|>"
    assert hf_tokenizer.pad_token_id != hf_tokenizer.eos_token_id
    messages = [
        {"role": "system", "content": "친절하게 답하세요."},
        {"role": "user", "content": "프랑스의 수도는?"},
        {"role": "assistant", "content": "파리입니다."},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|system|>\n친절하게 답하세요.<|eot|>\n<|user|>\n프랑스의 수도는?<|eot|>\n"
        "<|assistant|>\n파리입니다.<|eot|>\n"
    )
    out = hf_tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert hf_tokenizer.decode(trained) == "파리입니다.<|eot|>"
    prompt = hf_tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|assistant|>\n")


def test_stats_report_compression(demo_run):
    stats = json.loads((demo_run / "tokenizer" / "stats.json").read_text())
    held = stats["heldout"]
    assert held["documents"] > 0
    # Byte-level BPE on Korean: more than one byte per token once merges are learned.
    assert held["bytes_per_token"] > 1.5
    assert held["bytes_per_token"] > held["chars_per_token"]  # Hangul is 3 bytes in UTF-8


def test_heldout_documents_not_in_the_sample(demo_run, tmp_path):
    # Retraining on the same config is deterministic: same merges, same file.
    from hanlm.stages.rundir import load_run_config

    cfg = load_run_config(demo_run)
    texts, heldout, _ = tokenizer._sample(demo_run / "corpus", cfg)
    assert heldout and not set(heldout) & set(texts)
    assert len(texts) + len(heldout) <= sum(1 for _ in iter_corpus(demo_run / "corpus"))


def test_deterministic(demo_run):
    from hanlm.stages.rundir import load_run_config

    cfg = load_run_config(demo_run)
    texts, _, _ = tokenizer._sample(demo_run / "corpus", cfg)
    a = tokenizer.train(texts[:300], 512, 2, 8).to_str()
    b = tokenizer.train(texts[:300], 512, 2, 8).to_str()
    assert a == b


def test_vocab_too_small_and_no_corpus(tmp_path, cli):
    with pytest.raises(UserError, match="no room"):
        tokenizer.train(["가나다"], 300, 1, 32)
    result = cli("tokenizer", "--run", tmp_path / "empty")
    assert_user_error(result, "no finished corpus", "hanlm corpus")
    assert not (tmp_path / "empty" / "tokenizer").exists()


def test_rerun_trains_again_when_the_finished_tokenizer_was_damaged(demo_run, tmp_path, cli):
    import shutil

    run_dir = tmp_path / "run"
    for stage in ("corpus", "decontam", "demo", "tokenizer"):
        shutil.copytree(demo_run / stage, run_dir / stage)
    shutil.copyfile(demo_run / "config.toml", run_dir / "config.toml")
    assert cli("tokenizer", "--run", run_dir).code == 0  # up to date for this folder
    path = run_dir / "tokenizer" / "tokenizer.json"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    result = cli("tokenizer", "--run", run_dir)
    assert result.code == 0, result.err
    assert "fails its sha256 checksum" in result.err and "training it again" in result.err
    assert path.read_bytes() == whole
