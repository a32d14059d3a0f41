import pytest

from hanlm.config import Config, config_to_toml, load_config, save_config
from hanlm.errors import UserError


def test_default_is_the_demo_recipe():
    cfg = load_config()
    assert cfg.corpus.inputs == ["demo"]
    assert cfg.tokenizer.vocab_size == 4096  # demo: small
    assert Config().tokenizer.vocab_size == 65536  # real default: 64k


def test_set_overrides_parse_toml_values_and_bare_strings():
    cfg = load_config(
        overrides=["tokenizer.vocab_size=8192", "corpus.text_field=body", "corpus.near_dedup=false"]
    )
    assert cfg.tokenizer.vocab_size == 8192
    assert cfg.corpus.text_field == "body"
    assert cfg.corpus.near_dedup is False
    cfg = load_config(overrides=['corpus.inputs=["a/*.txt", "hf:x:train"]'])
    assert cfg.corpus.inputs == ["a/*.txt", "hf:x:train"]


def test_unknown_key_names_the_valid_choices():
    with pytest.raises(UserError) as e:
        load_config(overrides=["tokenizer.vocab=10"])
    assert "tokenizer.vocab" in e.value.message
    assert "vocab_size" in e.value.message
    with pytest.raises(UserError) as e:
        load_config(overrides=["tokeniser.vocab_size=10"])
    assert "tokenizer" in e.value.message


def test_bad_value_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"tokenizer\.vocab_size"):
        load_config(overrides=["tokenizer.vocab_size=-5"])
    with pytest.raises(UserError, match=r"shards\.workers"):
        load_config(overrides=["shards.workers=many"])
    with pytest.raises(UserError, match="no '='"):
        load_config(overrides=["shards.workers"])


def test_unknown_key_in_a_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[corpus]\ninput = ['x']\n")
    with pytest.raises(UserError) as e:
        load_config(path)
    assert "corpus.input" in e.value.message and "inputs" in e.value.message
    assert str(path) in e.value.message


def test_bad_toml_and_missing_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[corpus\n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(UserError, match="unknown recipe"):
        load_config("nope")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(overrides=["run.seed=7"])
    save_config(cfg, tmp_path)
    assert (tmp_path / "config.toml").read_text() == config_to_toml(cfg)
    again = load_config(run_dir=tmp_path)  # a run's own config is the default source
    assert again == cfg
