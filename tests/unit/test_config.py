import pytest

from hanlm.config import Config, config_to_toml, load_config
from hanlm.errors import UserError
from hanlm.stages.rundir import load_run_config, save_run_config


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
    with pytest.raises(UserError, match=r"shards\.val_fraction"):
        load_config(overrides=["shards.val_fraction=many"])
    with pytest.raises(UserError, match="no '='"):
        load_config(overrides=["shards.val_fraction"])


def test_unknown_key_in_a_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[corpus]\ninput = ['x']\n")
    with pytest.raises(UserError) as e:
        load_config(path)
    assert "corpus.input" in e.value.message and "inputs" in e.value.message
    assert str(path) in e.value.message


def test_a_mistake_inside_a_table_of_an_array_names_the_table_by_its_name(tmp_path):
    """An unknown key or a bad value in [[corpus.sources]] is the same one clear error as
    anywhere else, naming the source (it was a KeyError: '0' and a traceback)."""
    path = tmp_path / "bad.toml"
    path.write_text(
        '[[corpus.sources]]\nname = "web"\ninputs = ["a.jsonl"]\ncolour = "blue"\n\n'
        '[[corpus.sources]]\nname = "wiki"\ninputs = ["b.jsonl"]\nweight = "lots"\n'
    )
    with pytest.raises(UserError) as e:
        load_config(path)
    message = e.value.message
    assert (
        "corpus.sources[0] ('web').colour" in message and "valid keys: id_field, inputs" in message
    )
    assert "corpus.sources[1] ('wiki').weight" in message and "'lots'" in message
    with pytest.raises(UserError, match=r"sft.compare\[1\].bogus' \(valid keys: init, method"):
        load_config(overrides=['sft.compare=[{init = "none"}, {bogus = 1}]'])


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
    save_run_config(cfg, tmp_path)
    assert (tmp_path / "config.toml").read_text() == config_to_toml(cfg)
    again = load_run_config(tmp_path)  # a run's own config is the default source
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
    with pytest.raises(UserError) as e:  # a section's check of keys that go together
        load_config(overrides=["pretrain.micro_batch=3"])
    assert e.value.where == "--set pretrain.micro_batch=3"
    assert "command line" in e.value.fix


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
        load_run_config(None, str(folder))  # the run-aware loader knows a run's config.toml
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
    (tmp_path / "demo" / "config.toml").write_text("")
    assert load_run_config(None, "demo").corpus.inputs == ["demo"]


def test_a_run_directory_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a run")
    with pytest.raises(UserError, match=r"run directory \(--run\) .* is a file, not a folder"):
        load_run_config(path)
    with pytest.raises(UserError, match="cannot be created"):
        load_run_config(path / "inside")
    assert path.read_text() == "not a run"


def test_a_teacher_without_distillation_is_warned_about(capsys):
    load_config(overrides=["distill.teacher=teachers/[big]"])
    err = capsys.readouterr().err
    assert "distill.teacher is set (teachers/[big])" in err
    assert "distill.enabled is false" in err
    load_config(overrides=["distill.teacher=t", "distill.enabled=true"])
    load_config()
    assert "distill" not in capsys.readouterr().err


# --- the training components ------------------------------------------------------------------


def test_pretraining_and_sft_share_components_and_sft_overrides_its_own():
    cfg = Config()
    assert (cfg.optimizer.lr, cfg.optimizer.warmup_steps, cfg.optimizer.weight_decay) == (
        3e-4,
        100,
        0.1,
    )
    # SFT's defaults as they were: its own lr, warm-up, decay, cadence and logging
    s = cfg.sft
    assert (s.optimizer.lr, s.optimizer.warmup_steps, s.optimizer.weight_decay) == (1e-3, 10, 0.0)
    assert (s.optimizer.schedule, s.optimizer.decay_fraction) == ("cosine", 0.2)
    assert (s.optimizer.beta1, s.optimizer.beta2, s.optimizer.eps) == (0.9, 0.95, 1e-8)
    assert (s.checkpoint.every, s.checkpoint.every_minutes, s.checkpoint.resume) == (100, 0, "auto")
    assert (s.logging.log_every, s.logging.eval_every, s.logging.eval_batches) == (10, 0, 8)
    assert (cfg.checkpoint.every, cfg.logging.eval_every, cfg.logging.eval_batches) == (
        500,
        100,
        20,
    )


def test_the_demo_recipe():
    cfg = load_config("demo")
    assert (cfg.model.preset, cfg.optimizer.lr, cfg.precision.mode) == ("demo", 3e-3, "fp32")
    # SFT's peak is nanochat's share of pretraining's: 0.8 x 3e-3
    assert (cfg.checkpoint.every, cfg.sft.checkpoint.every, cfg.sft.optimizer.lr) == (
        100,
        0,
        2.4e-3,
    )


def test_a_key_of_an_earlier_layout_is_an_unknown_key_naming_where(tmp_path):
    """hanlm is at 0.x: keys that moved (pretrain.lr is optimizer.lr) are not read under their
    old names; a file that uses one fails at load time, naming the key and the file."""
    file = tmp_path / "config.toml"
    file.write_text("[pretrain]\nlr = 0.01\n")
    with pytest.raises(UserError, match=r"pretrain\.lr") as caught:
        load_config(file)
    assert str(file) in caught.value.message + str(caught.value.where)
    with pytest.raises(UserError, match=r"shards\.workers"):
        load_config(overrides=["shards.workers=2"])


def test_one_device_spelling_everywhere():
    for key in ("generate.device", "eval.device", "distill.teacher_device"):
        assert load_config(overrides=[f"{key}=cuda:1"]) is not None
        with pytest.raises(UserError, match=r"auto, cpu, cuda or cuda:N"):
            load_config(overrides=[f"{key}=gpu"])
    assert load_config(overrides=["distill.teacher_device=same"]).distill.teacher_device == "same"
    with pytest.raises(UserError, match=r"parallel\.device.*LOCAL_RANK"):
        load_config(overrides=["parallel.device=cuda:1"])
    with pytest.raises(UserError, match="auto, cpu, cuda or cuda:N"):
        load_config(overrides=["parallel.device=tpu"])


def test_bad_combinations_fail_at_load_naming_the_keys():
    with pytest.raises(UserError, match=r"pretrain\.global_batch_tokens 1,000 is not a multiple"):
        load_config(overrides=["pretrain.global_batch_tokens=1000"])
    with pytest.raises(
        UserError, match=r"sft\.batch_rows 13 is not a multiple of sft\.micro_batch"
    ):
        load_config(overrides=["sft.batch_rows=13"])
    with pytest.raises(UserError, match=r"parallel\.fsdp_float8_all_gather needs precision\.fp8"):
        load_config(
            overrides=[
                "precision.mode=fp8-emulate",
                "precision.fp8_recipe=rowwise",
                "parallel.fsdp_float8_all_gather=true",
            ]
        )
    # the same setting without FP8 changes nothing, so it is no error
    load_config(overrides=["precision.fp8_recipe=rowwise", "parallel.fsdp_float8_all_gather=true"])
    with pytest.raises(UserError, match=r"distill\.enabled is true but distill\.teacher is not"):
        load_config(overrides=["distill.enabled=true"])
