"""GGUF export (hanlm.share.gguf, `hanlm export --format gguf`): every tensor and metadata field
read back with gguf's own reader equals the Hugging Face folder it came from.

The llama.cpp round trip itself (loading the file in llama.cpp, generating) is
benchmarks/gguf_roundtrip.py: llama-cpp-python is a slow source build, not a test dependency.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_user_error
from hanlm.chat_template import CHAT_TEMPLATE, END_OF_TURN
from hanlm.config import load_config
from hanlm.data import tokenizer
from hanlm.errors import UserError
from hanlm.model import model_config
from hanlm.share import gguf as gguf_export
from hanlm.stages import export as export_stage

gguf = pytest.importorskip("gguf")

TEXTS = [
    "대한민국의 수도는 서울이다. 2024년 3월 15일에 비가 왔다.",
    'Hello, World! 12345 "café" (naïve)',
    "한국어 토크나이저를 시험한다 ㅋㅋ ㅠㅠ\n\n다음 줄",
    "서울특별시의 인구는 약 940만 명이며, 면적은 605.2㎢이다.",
]


def make_folder(folder: Path, *, tied: bool = True, hidden: int = 64, seed: int = 0) -> Path:
    """A Hugging Face folder as `hanlm export` writes it: tiny random Llama, hanlm tokenizer."""
    tok = tokenizer.train(TEXTS * 20, vocab_size=512, min_frequency=1, reserved=4)
    folder.mkdir(parents=True)
    tokenizer.save(tok, folder)
    config = model_config("tiny", vocab_size=tok.get_vocab_size(), seq_len=64)
    config.tie_word_embeddings = tied
    config.hidden_size = hidden
    config.head_dim = hidden // config.num_attention_heads
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # norms away from 1, so that a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("gguf") / "hf")


@pytest.fixture(scope="module")
def hf_weights(folder) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def written(folder, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf-out")
    return {
        t: Path(gguf_export.write_gguf(folder, out / f"m-{t}.gguf", gguf_type=t)["out"])
        for t in gguf_export.GGUF_TYPES
    }


def field(reader, key):
    return reader.fields[key].contents()


def hf_weight_of(tensor, weights: dict[str, np.ndarray], heads: int, kv_heads: int):
    """The GGUF tensor's values in Hugging Face's layout (the RoPE permutation undone) and the
    Hugging Face weight it should equal."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    values = values.reshape(tuple(reversed([int(n) for n in tensor.shape])))
    if tensor.name.endswith("attn_q.weight"):
        values = gguf_export.unpermute_rope(values, heads)
    elif tensor.name.endswith("attn_k.weight"):
        values = gguf_export.unpermute_rope(values, kv_heads)
    hf_name = {v: k for k, v in names_of(weights).items()}[tensor.name]
    return values, weights[hf_name]


def names_of(weights) -> dict[str, str]:
    return {n: gguf_export.gguf_tensor_name(n) for n in weights}


@pytest.mark.parametrize("gguf_type", gguf_export.GGUF_TYPES)
def test_every_tensor_equals_the_hf_weight(written, hf_weights, gguf_type):
    reader = gguf.GGUFReader(written[gguf_type])
    assert {t.name for t in reader.tensors} == set(names_of(hf_weights).values())
    q = gguf.GGMLQuantizationType
    expected_type = {"f16": q.F16, "bf16": q.BF16, "q8_0": q.Q8_0, "f32": q.F32}[gguf_type]
    for tensor in reader.tensors:
        values, weight = hf_weight_of(tensor, hf_weights, heads=4, kv_heads=2)
        assert values.shape == weight.shape, tensor.name
        if tensor.name.endswith("_norm.weight"):
            assert tensor.tensor_type == q.F32
            np.testing.assert_array_equal(values, weight)
            continue
        assert tensor.tensor_type == expected_type, tensor.name
        if gguf_type == "f32":
            np.testing.assert_array_equal(values, weight)  # exact: what llama.cpp computes on
        elif gguf_type == "f16":
            np.testing.assert_array_equal(values, weight.astype(np.float16).astype(np.float32))
        elif gguf_type == "bf16":
            expected = torch.from_numpy(weight).to(torch.bfloat16).float().numpy()
            np.testing.assert_array_equal(values, expected)
        else:  # q8_0: blocks of 32, levels -127..127 of one f16 scale (max |x| / 127) each
            blocks = weight.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            error = np.abs(values.reshape(-1, 32) - blocks)
            # half a level, plus up to 127 levels of the scale's f16 rounding (2^-11 relative)
            assert (error <= step * (0.5 + 127 * 2.0**-11) + 1e-9).all(), tensor.name
            assert error.max() > 0  # it is quantised, not a copy


def test_metadata(written, folder):
    reader = gguf.GGUFReader(written["q8_0"])
    config = json.loads((folder / "config.json").read_text())
    special = json.loads((folder / "special_tokens.json").read_text())
    expected = {
        "general.architecture": "llama",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0),
        "llama.context_length": 64,
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 192,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 16,
        "llama.rope.freq_base": 10_000.0,
        "llama.vocab_size": config["vocab_size"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.bos_token_id": special["bos"]["id"],
        "tokenizer.ggml.eos_token_id": special["eod"]["id"],
        "tokenizer.ggml.eot_token_id": special["eot"]["id"],
        "tokenizer.ggml.padding_token_id": special["pad"]["id"],
        "tokenizer.ggml.add_bos_token": False,
    }
    assert {k: field(reader, k) for k in expected} == expected
    assert field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert gguf.GGUFReader(written["f16"]).fields["general.file_type"].contents() == int(
        gguf.LlamaFileType.MOSTLY_F16
    )


def test_tokens_types_and_merges_equal_the_tokenizers(written, folder):
    reader = gguf.GGUFReader(written["f16"])
    tok = tokenizer.load(folder / "tokenizer.json")
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert tokens == [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = field(reader, "tokenizer.ggml.token_type")
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert specials >= {"<|bos|>", END_OF_TURN, "<|reserved_0|>"}
    for token, token_type in zip(tokens, types, strict=True):
        expected = gguf.TokenType.CONTROL if token in specials else gguf.TokenType.NORMAL
        assert token_type == expected, token
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    assert field(reader, "tokenizer.ggml.merges") == [" ".join(m) for m in merges]


def test_chat_template_renders_as_transformers_does(written, folder):
    """The GGUF's template (transformers' {% generation %} markers removed) gives a plain
    Jinja engine, as llama-cpp-python uses, the text transformers renders."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from transformers import AutoTokenizer

    template = field(gguf.GGUFReader(written["f16"]), "tokenizer.chat_template")
    assert "generation -%}" not in template and "endgeneration" not in template
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise ValueError(message)

    messages = [
        {"role": "system", "content": "짧게 답하세요."},
        {"role": "user", "content": "서울은 어디에 있나요?"},
        {"role": "assistant", "content": "한국에 있습니다."},
        {"role": "user", "content": "인구는?"},
    ]
    hf = AutoTokenizer.from_pretrained(folder)
    for add_generation_prompt in (True, False):
        plain = env.from_string(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            raise_exception=raise_exception,
        )
        assert plain == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )


def rope_hf(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """Hugging Face's rotary embedding of one head: dimension i pairs with i + d/2."""
    d = x.shape[0]
    freq = theta ** (-np.arange(0, d, 2) / d) * pos
    cos, sin = np.concatenate([np.cos(freq)] * 2), np.concatenate([np.sin(freq)] * 2)
    rotated = np.concatenate([-x[d // 2 :], x[: d // 2]])
    return x * cos + rotated * sin


def rope_llama_cpp(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """llama.cpp's (and Meta's) rotary embedding: dimensions 2i and 2i+1 form a pair."""
    d = x.shape[0]
    freq = theta ** (-np.arange(0, d, 2) / d) * pos
    even, odd = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2] = even * np.cos(freq) - odd * np.sin(freq)
    out[1::2] = even * np.sin(freq) + odd * np.cos(freq)
    return out


def test_rope_permutation_makes_llama_cpps_attention_scores_equal_transformers():
    rng = np.random.default_rng(0)
    heads, kv_heads, d, hidden = 4, 2, 16, 64
    wq = rng.standard_normal((heads * d, hidden))
    wk = rng.standard_normal((kv_heads * d, hidden))
    x_q, x_k = rng.standard_normal(hidden), rng.standard_normal(hidden)
    pq, pk = gguf_export.rope_permute(wq, heads), gguf_export.rope_permute(wk, kv_heads)
    for h in range(heads):
        g = h // (heads // kv_heads)  # grouped-query attention: the query head's kv head
        q_hf = rope_hf((wq @ x_q)[h * d : (h + 1) * d], 7, 10_000.0)
        k_hf = rope_hf((wk @ x_k)[g * d : (g + 1) * d], 3, 10_000.0)
        q_cpp = rope_llama_cpp((pq @ x_q)[h * d : (h + 1) * d], 7, 10_000.0)
        k_cpp = rope_llama_cpp((pk @ x_k)[g * d : (g + 1) * d], 3, 10_000.0)
        assert q_cpp @ k_cpp == pytest.approx(q_hf @ k_hf, rel=1e-9)
        # and without the permutation the scores differ: the test can fail
        q_raw = rope_llama_cpp((wq @ x_q)[h * d : (h + 1) * d], 7, 10_000.0)
        k_raw = rope_llama_cpp((wk @ x_k)[g * d : (g + 1) * d], 3, 10_000.0)
        assert q_raw @ k_raw != pytest.approx(q_hf @ k_hf, rel=1e-3)
    np.testing.assert_array_equal(gguf_export.unpermute_rope(pq, heads), wq)


def test_untied_model_writes_its_output_projection_and_odd_rows_stay_f16(tmp_path):
    """Untied: output.weight is the lm_head. A q8_0 row must be whole blocks of 32: a hidden
    size of 48 leaves those matrices in f16, as llama.cpp's converter does."""
    from safetensors.numpy import load_file

    folder = make_folder(tmp_path / "hf", tied=False, hidden=48, seed=1)
    summary = gguf_export.write_gguf(folder, tmp_path / "m.gguf", gguf_type="q8_0")
    assert summary["tied_embeddings"] is False
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    by_name = {t.name: t for t in reader.tensors}
    weights = load_file(folder / "model.safetensors")
    output, _ = hf_weight_of(by_name["output.weight"], weights, heads=4, kv_heads=2)
    np.testing.assert_array_equal(
        output, weights["lm_head.weight"].astype(np.float16).astype(np.float32)
    )
    q = gguf.GGMLQuantizationType
    assert by_name["blk.0.attn_q.weight"].tensor_type == q.F16  # rows of 48
    assert by_name["blk.0.ffn_down.weight"].tensor_type == q.Q8_0  # rows of 192


def test_old_tokenizers_declare_llama_cpps_smollm_type(folder, tmp_path):
    """A tokenizer trained before issue 19 (digits, then GPT-2's regex) is llama.cpp's
    `smollm` pre-tokenizer exactly: its runs still export."""
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    tok_json = json.loads((old / "tokenizer.json").read_text())
    tok_json["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": True,
            },
        ],
    }
    (old / "tokenizer.json").write_text(json.dumps(tok_json))
    summary = gguf_export.write_gguf(old, tmp_path / "old.gguf")
    assert summary["pre_tokenizer"] == "smollm"
    assert field(gguf.GGUFReader(tmp_path / "old.gguf"), "tokenizer.ggml.pre") == "smollm"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_bad_inputs_are_user_errors_and_write_nothing(folder, tmp_path):
    out = tmp_path / "out" / "m.gguf"
    with pytest.raises(UserError, match="does not exist"):
        gguf_export.write_gguf(tmp_path / "missing", out)
    with pytest.raises(UserError, match="unknown GGUF type 'q4_0'"):
        gguf_export.write_gguf(folder, out, gguf_type="q4_0")

    gpt2 = tmp_path / "gpt2"
    shutil.copytree(folder, gpt2)
    config = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UserError, match="writes Llama models"):
        gguf_export.write_gguf(gpt2, out)
    (gpt2 / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    with pytest.raises(UserError, match="attention_bias"):
        gguf_export.write_gguf(gpt2, out)
    del config["rms_norm_eps"]
    (gpt2 / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="rms_norm_eps"):
        gguf_export.write_gguf(gpt2, out)

    other = tmp_path / "other-pretokenizer"
    shutil.copytree(folder, other)
    tok_json = json.loads((other / "tokenizer.json").read_text())
    tok_json["pre_tokenizer"] = {"type": "Whitespace"}
    (other / "tokenizer.json").write_text(json.dumps(tok_json))
    with pytest.raises(UserError, match=r"none that llama\.cpp implements") as info:
        gguf_export.write_gguf(other, out)
    assert "hanlm tokenizer --force" in info.value.fix
    assert not out.exists()

    # an existing file: a user's is kept, an earlier GGUF is replaced only when asked
    out.write_text("my notes")
    with pytest.raises(UserError, match="not hanlm's output"):
        gguf_export.write_gguf(folder, out)
    assert out.read_text() == "my notes"
    out.unlink()
    gguf_export.write_gguf(folder, out, gguf_type="q8_0")
    before = out.read_bytes()
    with pytest.raises(UserError, match="--force"):
        gguf_export.write_gguf(folder, out)
    assert out.read_bytes() == before
    gguf_export.write_gguf(folder, out, replace_earlier=True)
    assert gguf.GGUFReader(out).fields["general.file_type"].contents() == 1  # f16 now
    assert leftovers(out.parent) == []


def test_a_failed_write_leaves_no_file(folder, tmp_path, monkeypatch):
    """Nothing half-written: a write that fails midway leaves neither the file nor its temp."""

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", fail)
    with pytest.raises(OSError, match="disk full"):
        gguf_export.write_gguf(folder, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_missing_gguf_package_names_the_extra(folder, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(UserError, match="hanlm\\[gguf\\]"):
        gguf_export.write_gguf(folder, tmp_path / "m.gguf")


def test_cli_writes_the_gguf_and_an_ollama_modelfile(folder, tmp_path, cli):
    run = tmp_path / "run"
    result = cli(
        "export", "--run-dir", run, "--format", "gguf", "--source", folder, "--gguf-type", "q8_0"
    )
    assert result.code == 0, result.err
    out = run / "gguf" / "hf-q8_0.gguf"
    reader = gguf.GGUFReader(out)
    assert field(reader, "general.name") == "run-hf"
    modelfile = (run / "gguf" / "hf-q8_0.Modelfile").read_text()
    generate = load_config().generate
    assert modelfile.startswith("FROM ./hf-q8_0.gguf\n")
    assert f'PARAMETER stop "{END_OF_TURN}"' in modelfile
    assert f"PARAMETER repeat_penalty {generate.repetition_penalty}" in modelfile
    assert 'TEMPLATE """' in modelfile and "<|{{ .Role }}|>" in modelfile
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == (
        CHAT_TEMPLATE
    )

    again = cli(
        "export", "--run-dir", run, "--format", "gguf", "--source", folder, "--gguf-type", "q8_0"
    )
    assert_user_error(again, "earlier output", "--force")
    forced = cli(
        "export",
        "--run-dir",
        run,
        "--format",
        "gguf",
        "--source",
        folder,
        "--gguf-type",
        "q8_0",
        "--force",
    )
    assert forced.code == 0, forced.err


def test_cli_user_errors(folder, tmp_path, cli):
    run = tmp_path / "run"
    assert_user_error(
        cli(
            "export", "--run-dir", run, "--format", "gguf", "--source", folder, "--gguf-type", "q4"
        ),
        "unknown GGUF type",
    )
    assert_user_error(
        cli("export", "--run-dir", run, "--format", "gguf"), "no exported model", "hanlm export"
    )
    assert_user_error(
        cli(
            "export",
            "--run-dir",
            run,
            "--format",
            "gguf",
            "--source",
            folder,
            "--out",
            tmp_path / "m.bin",
        ),
        "should end in .gguf",
    )
    assert_user_error(
        cli("export", "--run-dir", run, "--format", "gguf", "--checkpoint", "4"), "--checkpoint"
    )
    assert_user_error(cli("export", "--run-dir", run, "--gguf-type", "q8_0"), "--format gguf")
    assert not (run / "gguf").exists()


def test_default_source_is_the_chat_model_then_the_base_model(folder, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(folder, run / "pretrain" / "hf")
    cfg = load_config()
    first = export_stage.run_gguf(cfg, run, gguf_type="q8_0")
    assert first["source"] == str(run / "pretrain" / "hf")
    assert first["out"] == str(run / "gguf" / "base-q8_0.gguf")
    shutil.copytree(folder, run / "sft" / "hf")
    second = export_stage.run_gguf(cfg, run, gguf_type="q8_0")
    assert second["source"] == str(run / "sft" / "hf")
    assert Path(second["modelfile"]).read_text().startswith("FROM ./chat-q8_0.gguf\n")
