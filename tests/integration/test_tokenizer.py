import json
import unicodedata

import pytest

from conftest import assert_user_error, korquad_contexts
from hanlm.data import tokenizer
from hanlm.data.corpus import iter_corpus
from hanlm.errors import UserError
from hanlm.stages import run_facts

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
    tok = run_facts.tokenizer(demo_run)
    for text in MIXED:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
        ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert hf_tokenizer.decode(ids) == text


def test_round_trip_on_real_text(demo_run, shared_data):
    tok = run_facts.tokenizer(demo_run)
    for text in korquad_contexts(shared_data)[:200]:
        text = unicodedata.normalize("NFC", text)
        assert tok.decode(tok.encode(text).ids) == text


def test_nfc_normaliser(demo_run):
    tok = run_facts.tokenizer(demo_run)
    text = "한국어 토크나이저"
    assert tok.encode(unicodedata.normalize("NFD", text)).ids == tok.encode(text).ids


def test_digits_split_one_by_one(demo_run):
    tok = run_facts.tokenizer(demo_run)
    tokens = tok.encode("12345").tokens
    assert tokens == ["1", "2", "3", "4", "5"]
    pieces = [tok.decode([i]) for i in tok.encode("가격은 98765원, 전화 010-2345").ids]
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert "".join(digit_pieces) == "98765010" + "2345"
    assert all(len(p) == 1 for p in digit_pieces)


def test_special_tokens_reserved_and_single(demo_run):
    spec = json.loads((demo_run / "tokenizer" / "special_tokens.json").read_text())
    tok = run_facts.tokenizer(demo_run)
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
    stats = tokenizer.TokenizerStats.read(demo_run / "tokenizer" / tokenizer.STATS_FILE)
    held = stats.heldout
    assert held.documents > 0
    # Byte-level BPE on Korean: more than one byte per token once merges are learned.
    assert held.bytes_per_token > 1.5
    assert held.bytes_per_token > held.chars_per_token  # Hangul is 3 bytes in UTF-8


def test_heldout_documents_not_in_the_sample(demo_run, tmp_path):
    # Retraining on the same config is deterministic: same merges, same file.
    from hanlm.stages.rundir import load_run_config

    cfg = load_run_config(demo_run)
    texts, heldout, _ = tokenizer.sample_texts(demo_run / "corpus", cfg)
    assert heldout and not set(heldout) & set(texts)
    assert len(texts) + len(heldout) <= sum(1 for _ in iter_corpus(demo_run / "corpus"))


def test_deterministic(demo_run):
    from hanlm.stages.rundir import load_run_config

    cfg = load_run_config(demo_run)
    texts, _, _ = tokenizer.sample_texts(demo_run / "corpus", cfg)
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
    assert "fails its sha256 checksum" in result.err and "making it again" in result.err
    assert path.read_bytes() == whole


# llama.cpp's regexes (src/llama-vocab.cpp), the references hanlm's pre-tokenizers must equal.
LLAMA_CPP_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA_CPP_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRETOKENIZER_CASES = [
    *MIXED,
    '(서울은) 2024년 "한국"의 수도   입니다.\n\n\n  다음 문단\r\n끝  ',
    "I'VE been 'told he's there, 'RE you sure? We'Ve a'lL",
    "가격: 12,345.67원 (약 9%) — 1st/2nd ٣ Ⅻ ½ ² ①",
    "\t\t들여쓰기\n    코드 = x[0] + y_1;\n",
    "ｅｎ 전각ＡＢＣ１２３ ｢괄호｣ 。、",
    "   ",
    "끝에 공백과 줄바꿈 \n",
]


def _pieces(pre_tokenizer, text: str) -> list[str]:
    return [text[a:b] for _, (a, b) in pre_tokenizer.pre_tokenize_str(text)]


def test_pre_tokenizer_splits_as_llama_cpps_qwen2_type():
    """hanlm's pre-tokenizer splits text exactly as llama.cpp's `qwen2` regex (the type a GGUF
    export declares): digits one by one, a letter run with one leading space or mark."""
    regex = pytest.importorskip("regex")
    pre = tokenizer.build_untrained().pre_tokenizer
    for text in PRETOKENIZER_CASES:
        assert _pieces(pre, text) == regex.findall(LLAMA_CPP_QWEN2, text), text
    assert _pieces(pre, " 2024년") == [" ", "2", "0", "2", "4", "년"]


def test_old_pre_tokenizer_splits_as_llama_cpps_smollm_type():
    """Tokenizers trained before (digits, then GPT-2's byte-level regex) split as llama.cpp's
    `smollm` type: `\\p{N}` isolated, then GPT-2's regex on every piece."""
    regex = pytest.importorskip("regex")
    from tokenizers import pre_tokenizers

    old = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in PRETOKENIZER_CASES:
        pieces = [p for p in regex.split(r"(\p{N})", text) if p]
        expected = [w for piece in pieces for w in regex.findall(LLAMA_CPP_GPT2, piece)]
        assert _pieces(old, text) == expected, text


def test_llama_cpp_pre_type_tells_tokenizers_apart():
    new = json.loads(tokenizer.train(MIXED * 5, 512, 1, 4).to_str())
    assert tokenizer.llama_cpp_pre_type(new) == "qwen2"
    old = json.loads(json.dumps(new))
    old["pre_tokenizer"]["pretokenizers"] = [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]
    assert tokenizer.llama_cpp_pre_type(old) == "smollm"
    for change in (
        {"normalizer": {"type": "NFKC"}},  # llama.cpp normalises nothing
        {"model": {**new["model"], "byte_fallback": True}},
        {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}},
    ):
        assert tokenizer.llama_cpp_pre_type({**new, **change}) is None
    changed_regex = json.loads(json.dumps(new))
    changed_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] += "|x"
    assert tokenizer.llama_cpp_pre_type(changed_regex) is None


def _old_pipeline(tok):
    """The same vocabulary with the pre-tokenizer of tokenizers trained before issue 19."""
    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"]["pretokenizers"] = [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]
    return Tokenizer.from_str(json.dumps(spec))


def test_a_long_text_encodes_in_pieces_to_the_tokens_of_the_whole():
    """Issue 29: a huge document is given to the tokenizers library in pieces (its memory grows
    ~250 bytes per character); cut where text_pieces cuts, the tokens are the whole text's, with
    the current pre-tokenizer and the older one alike."""
    import random

    rng = random.Random(0)
    cases = [*PRETOKENIZER_CASES, "<|endoftext|> 특수 <|bos|>", "e\u0301 조합  문자"]
    text = "".join(rng.choice(cases) + rng.choice(["", " ", "\n", "  ", "\n\n", "다. "])
                   for _ in range(400))  # fmt: skip
    new = tokenizer.train(MIXED * 5 + PRETOKENIZER_CASES, 512, 1, 4)
    for tok in (new, _old_pipeline(new)):
        whole = tok.encode(text).ids
        for size in (30, 97, 1000, 5000):
            pieces = list(tokenizer.text_pieces(text, size))
            assert "".join(pieces) == text and max(map(len, pieces)) <= size
            assert len(pieces) > len(text) // size
            assert [i for p in pieces for i in tok.encode(p).ids] == whole, size
        # every place a cut may go, one at a time, in a stretch holding most cases
        stretch = text[:1500]
        expected = tok.encode(stretch).ids
        for cut in range(1, len(stretch)):
            if tokenizer.cut_points(stretch[: cut + 1], cut) == [cut]:
                ids = tok.encode(stretch[:cut]).ids + tok.encode(stretch[cut:]).ids
                assert ids == expected, repr(stretch[cut - 10 : cut + 10])
    assert tokenizer.cut_points("가" * 25, 10) == [10, 20]  # no space: cut at the limit
    assert list(tokenizer.text_pieces("짧은 글", 100)) == ["짧은 글"]
