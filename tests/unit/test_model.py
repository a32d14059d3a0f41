from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    BertConfig,
    GPT2Config,
    LlamaConfig,
    MambaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
    T5Config,
)

from hanlm.errors import UserError
from hanlm.model import (
    PRESETS,
    build_model,
    describe,
    flops_per_token,
    model_config,
    parameter_count,
    preset_names,
)

# The counts in hanlm/model.py's docstring: (vocab 4,096, vocab 65,536).
DOCUMENTED_TOTALS = {
    "tiny": (360_768, 4_292_928),
    "demo": (4_196_608, 19_925_248),
    "125m": (78_662_400, 125_848_320),
    "350m": (287_360_000, 350_274_560),
    "1.3b": (1_216_448_512, 1_342_277_632),
}


def counted(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight once


def assert_count_matches(config, model) -> None:
    expected = parameter_count(config)
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings().weight
    assert expected["total"] == counted(model)
    assert expected["embedding"] == embedding.numel()
    assert expected["lm_head"] == (0 if output is embedding else output.numel())
    assert expected["non_embedding"] == counted(model) - embedding.numel() - expected["lm_head"]
    assert expected["per_layer"] == counted(model.model.layers[0])


def small_llama(**overrides) -> LlamaConfig:
    values = {**PRESETS["tiny"], "vocab_size": 1024, "max_position_embeddings": 64}
    return LlamaConfig(**{**values, **overrides})


def write_config(config, path: Path) -> Path:
    config.save_pretrained(path)
    return path


# --- presets and counts -------------------------------------------------------------------------


def test_preset_names_are_the_presets():
    assert preset_names() == ["tiny", "demo", "125m", "350m", "1.3b"]


@pytest.mark.parametrize("name", ["tiny", "demo"])
def test_small_presets_count_what_is_built(name):
    config = model_config(name, vocab_size=4096, seq_len=128)
    assert_count_matches(config, build_model(config))


@pytest.mark.parametrize("name", ["125m", "350m", "1.3b"])
def test_large_presets_count_what_is_built_on_meta(name):
    config = model_config(name, vocab_size=65_536, seq_len=2048)
    model = build_model(config, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert_count_matches(config, model)


@pytest.mark.parametrize("name", preset_names())
def test_documented_totals(name):
    for vocab, total in zip((4096, 65_536), DOCUMENTED_TOTALS[name], strict=True):
        assert parameter_count(model_config(name, vocab_size=vocab, seq_len=512))["total"] == total


def test_tiny_is_well_under_a_million_and_1_3b_is_the_field_reports_size():
    assert parameter_count(model_config("tiny", vocab_size=1024, seq_len=64))["total"] < 500_000
    big = parameter_count(model_config("1.3b", vocab_size=65_536, seq_len=2048))
    assert 1.30e9 <= big["total"] <= 1.40e9
    assert big["lm_head"] == 0  # tied
    assert big["total"] == big["embedding"] + big["non_embedding"]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])  # MQA, GQA, MHA
@pytest.mark.parametrize("biases", [(False, False), (True, False), (False, True), (True, True)])
def test_llama_variants_count_what_is_built(tied, kv_heads, biases):
    attention_bias, mlp_bias = biases
    config = small_llama(
        tie_word_embeddings=tied,
        num_key_value_heads=kv_heads,
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
    )
    assert_count_matches(config, build_model(config))


def test_head_dim_apart_from_hidden_over_heads_is_counted():
    config = small_llama(head_dim=32)  # 4 heads x 32 = 128 != hidden 64
    assert_count_matches(config, build_model(config))


def small_family(config_class, **overrides):
    shape = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    return config_class(**shape, num_key_value_heads=2, intermediate_size=96, **overrides)


FAMILY_CONFIGS = {
    "mistral": lambda: small_family(MistralConfig, tie_word_embeddings=False),
    "qwen2": lambda: small_family(Qwen2Config, tie_word_embeddings=True),
    "qwen3": lambda: small_family(Qwen3Config, head_dim=24, tie_word_embeddings=True),
    "qwen3-bias": lambda: small_family(Qwen3Config, attention_bias=True, tie_word_embeddings=False),
}


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_llama_family_files_count_what_is_built(tmp_path, family):
    path = write_config(FAMILY_CONFIGS[family](), tmp_path / family)
    config = model_config(str(path), vocab_size=777, seq_len=64)
    assert config.model_type == family.split("-")[0]
    assert config.vocab_size == 777
    assert_count_matches(config, build_model(config))


def test_a_model_without_attention_is_counted_and_built(tmp_path):
    mamba = MambaConfig(hidden_size=32, num_hidden_layers=2, state_size=4)
    config = model_config(str(write_config(mamba, tmp_path)), vocab_size=300, seq_len=64)
    assert parameter_count(config)["total"] == counted(build_model(config))  # no "sdpa" asked
    assert flops_per_token(config, 64)["attention"] == 0


def test_other_model_types_are_counted_on_meta(tmp_path):
    gpt2 = GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32)
    config = model_config(str(write_config(gpt2, tmp_path / "gpt2")), vocab_size=500, seq_len=64)
    model = build_model(config)
    counts = parameter_count(config)
    assert counts["total"] == counted(model)
    assert counts["embedding"] == 500 * 32
    assert counts["lm_head"] == 0  # GPT-2 ties its head
    assert counts["per_layer"] == counted(model.transformer.h[0])
    assert config.n_positions == 64  # raised to seq_len: GPT-2's positions are parameters


# --- FLOPs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides", [{}, {"tie_word_embeddings": False, "num_key_value_heads": 4}]
)
def test_flops_match_flop_counter_exactly(overrides):
    config = small_llama(**overrides)
    model = build_model(config)
    batch, seq_len = 2, 64
    tokens = torch.randint(0, config.vocab_size, (batch, seq_len))
    # The math SDPA kernel runs attention as batched matmuls that FlopCounterMode counts; the
    # fused CPU kernel (`_scaled_dot_product_flash_attention_for_cpu`) has no FLOP formula
    # registered, so under it only the dense part would be counted. Both compute the full
    # seq_len x seq_len scores despite the causal mask, as flops_per_token assumes.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens).loss.backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    expected = {k: v * batch * seq_len for k, v in flops_per_token(config, seq_len).items()}
    # every Linear (the LM head included) is an mm; the attention score and value products bmm
    assert by_op == {"aten.mm": expected["dense"], "aten.bmm": expected["attention"]}
    assert counter.get_total_flops() == expected["total"]


def test_flop_parts_follow_the_formula():
    config = model_config("1.3b", vocab_size=65_536, seq_len=2048)
    flops = flops_per_token(config, 2048)
    counts = parameter_count(config)
    assert flops["six_n"] == 6 * counts["total"]
    assert flops["attention"] == 12 * 24 * 16 * 128 * 2048
    norms = 24 * 2 * 2048 + 2048
    # tied: the embedding lookup is no matmul, the output projection through the same weight is
    assert flops["dense"] == 6 * (counts["total"] - norms)
    assert flops["total"] == flops["dense"] + flops["attention"]
    assert flops_per_token(config, 4096)["attention"] == 2 * flops["attention"]


# --- configs from files -------------------------------------------------------------------------


def test_config_file_and_folder_load_with_vocab_and_context_from_the_run(tmp_path):
    folder = write_config(small_llama(vocab_size=32_000, max_position_embeddings=4096), tmp_path)
    for spec in (folder, folder / "config.json"):
        config = model_config(str(spec), vocab_size=4096, seq_len=512)
        assert isinstance(config, LlamaConfig)
        assert config.vocab_size == 4096
        assert config.max_position_embeddings == 4096  # the file's is larger: kept
        assert config.hidden_size == 64
    longer = model_config(str(folder), vocab_size=4096, seq_len=8192)
    assert longer.max_position_embeddings == 8192


def test_preset_config_takes_vocab_and_context_from_the_run():
    config = model_config("demo", vocab_size=4096, seq_len=256)
    assert (config.vocab_size, config.max_position_embeddings) == (4096, 256)
    assert config.tie_word_embeddings
    assert config.rms_norm_eps == 1e-5


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UserError) as info:
        model_config("7b", vocab_size=1024, seq_len=64)
    assert "'7b'" in str(info.value)
    for name in preset_names():
        assert name in str(info.value)


def test_missing_config_file_is_named(tmp_path):
    missing = tmp_path / "nowhere" / "config.json"
    with pytest.raises(UserError, match="does not exist") as info:
        model_config(str(missing), vocab_size=1024, seq_len=64)
    assert str(missing) in str(info.value)
    with pytest.raises(UserError, match=r"config\.json"):
        model_config(str(tmp_path), vocab_size=1024, seq_len=64)  # a folder without one


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"model_type": "llama",\n "hidden_size": 64,,}', "line 2"),
        ("[1, 2]", "not a JSON object"),
        ('{"hidden_size": 64}', "no model_type"),
        ('{"model_type": "my-own-arch"}', "does not know"),
        ('{"model_type": "llama", "hidden_size": 65, "num_attention_heads": 4}', "rejects"),
    ],
)
def test_bad_config_files_are_user_errors(tmp_path, text, needle):
    file = tmp_path / "config.json"
    file.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=needle) as info:
        model_config(str(file), vocab_size=1024, seq_len=64)
    assert str(file) in str(info.value)


def test_a_config_with_its_own_code_runs_it_only_when_the_recipe_trusts_it(tmp_path):
    from foreign_models import qwen2_model, with_own_code

    from hanlm import remote_code

    folder = with_own_code(qwen2_model(tmp_path / "custom"))
    with pytest.raises(UserError, match=r"model\.trust_remote_code") as info:
        model_config(str(folder), vocab_size=1024, seq_len=64)
    assert "auto_map" in str(info.value)
    with remote_code.trusting(True):
        config = model_config(str(folder), vocab_size=1024, seq_len=64)
        model = build_model(config, device="meta")
    assert type(config).__name__ == "MyConfig" and config.vocab_size == 1024
    assert type(model).__name__ == "MyCustomForCausalLM"
    assert not remote_code.allowed()  # the switch is the block's, not the process's


@pytest.mark.parametrize("config", [BertConfig(), T5Config()], ids=["bert", "t5"])
def test_configs_of_other_than_decoder_only_lms_are_refused(tmp_path, config):
    path = write_config(config, tmp_path)
    with pytest.raises(UserError, match="not a decoder-only causal language model"):
        model_config(str(path), vocab_size=1024, seq_len=64)


# --- building -----------------------------------------------------------------------------------


def test_build_is_seeded_and_leaves_the_callers_rng_alone():
    config = small_llama()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first, again, other = (build_model(config, seed=s) for s in (7, 7, 8))
    assert torch.equal(torch.get_rng_state(), state)
    weights = [m.model.layers[0].mlp.up_proj.weight for m in (first, again, other)]
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], weights[2])
    assert first.training
    assert first.config._attn_implementation == "sdpa"


def test_build_in_another_dtype():
    model = build_model(small_llama(), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_build_on_meta_allocates_nothing():
    config = model_config("1.3b", vocab_size=65_536, seq_len=2048)
    model = build_model(config, device="meta", dtype=torch.bfloat16)
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_describe_is_one_line_with_the_shape():
    line = describe(model_config("1.3b", vocab_size=65_536, seq_len=2048))
    assert "\n" not in line
    for part in ("24 layers", "hidden 2048", "16/8", "65,536", "tied", "1.34B"):
        assert part in line
    assert "0.16M" in describe(model_config("tiny", vocab_size=1024, seq_len=64))
