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


def test_a_bad_override_is_located_at_the_override_not_the_recipe():
    with pytest.raises(UserError) as e:
        load_config(overrides=["corpus.min_chars=abc"])
    assert e.value.where == "--set corpus.min_chars=abc"
    assert "demo.toml" not in e.value.message
    with pytest.raises(UserError) as e:
        load_config(overrides=["corpus=3"])  # a whole section replaced by a value
    assert e.value.where == "--set corpus=3"
    with pytest.raises(UserError) as e:  # a command-line flag (here --min-chars -4)
        load_config(values={"corpus.min_chars": -4})
    assert e.value.where == "the command-line option setting corpus.min_chars"


def test_a_bad_value_in_the_file_is_located_in_the_file(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text("[corpus]\nmin_chars = -1\n")
    with pytest.raises(UserError) as e:
        load_config(path, overrides=["tokenizer.vocab_size=-5"])
    assert e.value.where == f"{path}, --set tokenizer.vocab_size=-5"
    path.write_text("corpus = 5\n")
    with pytest.raises(UserError, match=r"gives 'corpus' a value \(5\) where a section belongs"):
        load_config(path, overrides=["corpus.min_chars=1"])


def test_config_paths_that_are_not_toml_files(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    with pytest.raises(UserError, match="is a folder, not a TOML file") as e:
        load_config(folder)
    assert "a TOML file's path" in e.value.message
    (folder / "config.toml").write_text("")
    with pytest.raises(UserError, match=rf"give --config {folder}/config\.toml"):
        load_config(str(folder))
    binary = tmp_path / "weights.toml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(UserError, match="not UTF-8 text"):
        load_config(binary)
    plain = tmp_path / "settings"  # an existing file without .toml is read as TOML
    plain.write_text("[run]\nseed = 3\n")
    assert load_config(str(plain)).run.seed == 3


def test_a_recipe_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()  # e.g. made by `hanlm demo --out demo`
    assert load_config("demo").corpus.inputs == ["demo"]


def test_a_run_directory_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a run")
    with pytest.raises(UserError, match=r"run directory \(--run\) .* is a file, not a folder"):
        load_config(run_dir=path)
    with pytest.raises(UserError, match="cannot be created"):
        load_config(run_dir=path / "inside")
    assert path.read_text() == "not a run"


def test_a_teacher_without_distillation_is_warned_about(capsys):
    load_config(overrides=["distill.teacher=teachers/[big]"])
    err = capsys.readouterr().err
    assert "distill.teacher is set (teachers/[big])" in err
    assert "distill.enabled is false" in err
    load_config(overrides=["distill.teacher=t", "distill.enabled=true"])
    load_config()
    assert "distill" not in capsys.readouterr().err
