"""The model-folder check every loader runs first: healthy folders (one file or sharded) pass and
load; each kind of damage is one UserError naming it, before transformers reads anything."""

import os
import shutil
import subprocess
import sys

import pytest

from damaged_models import DAMAGES, WEIGHT_DAMAGES, damaged_copy
from hanlm.errors import UserError
from hanlm.inference import load
from hanlm.model import build_model, model_config
from hanlm.model_folder import check_model_folder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens.json")


def _write_folder(folder, demo_run, **save_options):
    vocab = 1024
    build_model(model_config("tiny", vocab_size=vocab, seq_len=64)).save_pretrained(
        folder, **save_options
    )
    for name in TOKENIZER_FILES:
        shutil.copyfile(demo_run / "tokenizer" / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def healthy(demo_run, tmp_path_factory):
    return _write_folder(tmp_path_factory.mktemp("healthy") / "model", demo_run)


def test_a_healthy_folder_passes_and_loads(healthy):
    assert check_model_folder(healthy) == healthy
    assert load(healthy, device="cpu").vocab_size == 1024


def test_a_sharded_folder_passes_and_loads(demo_run, tmp_path):
    folder = _write_folder(tmp_path / "sharded", demo_run, max_shard_size="200KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    assert check_model_folder(folder) == folder
    assert load(folder, device="cpu").vocab_size == 1024


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damage_is_one_user_error(healthy, tmp_path, damage):
    folder, phrase = damaged_copy(healthy, tmp_path / "m", damage)
    with pytest.raises(UserError) as caught:
        check_model_folder(folder)
    assert phrase in caught.value.message
    assert caught.value.fix, "every refusal says how to fix it"


@pytest.mark.parametrize("damage", ["no tokenizer", "garbled tokenizer"])
def test_tokenizer_files_are_checked_only_when_needed(healthy, tmp_path, damage):
    folder, _ = damaged_copy(healthy, tmp_path / "m", damage)
    assert check_model_folder(folder, tokenizer=False) == folder


def test_weight_damages_are_refused_without_a_tokenizer_too(healthy, tmp_path):
    for damage in WEIGHT_DAMAGES:
        folder, phrase = damaged_copy(healthy, tmp_path / damage.replace(" ", "_"), damage)
        with pytest.raises(UserError, match=phrase):
            check_model_folder(folder, tokenizer=False)


def test_pickle_weights_are_refused_with_the_reason_and_the_conversion(healthy, tmp_path):
    folder, _ = damaged_copy(healthy, tmp_path / "m", "pickle weights")
    with pytest.raises(UserError) as caught:
        check_model_folder(folder)
    message = caught.value.message
    assert "pytorch_model.bin" in message and "can run any code" in message
    assert "save_pretrained(DIR, safe_serialization=True)" in message


def test_not_a_folder(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        check_model_folder(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_model_folder(tmp_path / "file")
    with pytest.raises(UserError, match="not a Hugging Face model folder"):
        check_model_folder(tmp_path)


def test_tokenizer_and_config_loaders_check_the_folder_first(healthy, demo_run, tmp_path):
    from hanlm.inference import load_tokenizer, read_config
    from hanlm.model_folder import is_model_folder

    assert is_model_folder(healthy) and not is_model_folder(demo_run / "tokenizer")
    assert load_tokenizer(demo_run / "tokenizer").get_vocab()  # a tokenizer folder alone
    assert read_config(healthy).get_text_config().vocab_size == 1024
    with pytest.raises(UserError, match="is not a tokenizer folder: it does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"the tokenizer folder .* has no tokenizer files"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(UserError, match=r"not a Hugging Face model folder \(no config.json\)"):
        read_config(demo_run / "tokenizer")


HUB_CHECK = """
import sys
from hanlm.errors import UserError
from hanlm.model_folder import check_model_folder
try:
    print(check_model_folder(sys.argv[1]))
except UserError as e:
    print("UserError:", e.message)
"""


def _hub_check(name: str, hf_home, cwd) -> str:
    """check_model_folder(name) in a fresh process (huggingface_hub reads HF_HOME and
    HF_HUB_OFFLINE when imported), offline."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", HUB_CHECK, name], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_hub_id_names_its_cached_snapshot_and_offline_says_how_to_get_it(healthy, tmp_path):
    """`org/name` where no such folder is: the Hub cache's snapshot (here, put there as `hf
    download` would), checked like a folder; offline and not cached, how to download it."""
    said = _hub_check("hanlm-test/tiny-ko", tmp_path / "hf", tmp_path)
    assert said.startswith("UserError: no folder hanlm-test/tiny-ko here") and "offline" in said
    assert "`hf download hanlm-test/tiny-ko`" in said
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--hanlm-test--tiny-ko"
    shutil.copytree(healthy, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    assert _hub_check("hanlm-test/tiny-ko", tmp_path / "hf", tmp_path) == str(
        repo / "snapshots" / revision
    )
    # a local folder of that name wins over the Hub
    local = tmp_path / "hanlm-test" / "tiny-ko"
    shutil.copytree(healthy, local)
    assert _hub_check("hanlm-test/tiny-ko", tmp_path / "hf", tmp_path) == "hanlm-test/tiny-ko"
