"""`hanlm doctor` on small synthetic model folders (the trained ones are checked in test_sft.py):
it flags an end token whose rows sit with the unused tokens', padding equal to the end-of-turn
and generation that does not stop on it, and passes a folder without those faults."""

import json
import shutil

import pytest
import torch
from transformers import GenerationConfig

from conftest import assert_user_error
from damaged_models import DAMAGES, damaged_copy
from hanlm.chat import doctor, tokens
from hanlm.model import build_model, model_config


def write_model(folder, demo_run, *, eot_untrained: bool, pad_is_eot: bool, eos_has_eot: bool):
    special = tokens.load_special_tokens(demo_run / "tokenizer")
    eot, pad, eod = (special[k]["id"] for k in ("eot", "pad", "eod"))
    model = build_model(model_config("tiny", vocab_size=special["vocab_size"], seq_len=64))
    weight = model.get_input_embeddings().weight
    # what pretraining does to rows it never shows: one shared push away from the hidden states
    unused = tokens.reference_ids(special) + ([eot] if eot_untrained else [])
    push = torch.randn(weight.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        weight[unused] += push / push.norm() * weight.norm(dim=1).median()
    pad_id = eot if pad_is_eot else pad
    eos = [eot, eod] if eos_has_eot else [eod]
    model.config.pad_token_id = pad_id
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad_id)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens.json"):
        shutil.copyfile(demo_run / "tokenizer" / name, folder / name)
    if pad_is_eot:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["pad_token"] = "<|eot|>"
        (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return folder


def test_flags_a_broken_model(demo_run, tmp_path, cli):
    folder = write_model(
        tmp_path / "broken", demo_run, eot_untrained=True, pad_is_eot=True, eos_has_eot=False
    )
    report = doctor.diagnose(folder)
    problems = {f["check"]: f for f in report["findings"] if f["level"] == "problem"}
    assert not report["healthy"] and report["end_of_turn"] == "<|eot|>"
    assert set(problems) == {"padding", "generation_config", "under-trained"}
    assert "<|eot|>" in problems["padding"]["what"]
    assert "<|eot|>" in problems["under-trained"]["what"]
    assert all(f["fix"] for f in problems.values())
    result = cli("doctor", folder)
    assert result.code == 1 and "problem" in result.err


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ({"eot_untrained": True}, "under-trained"),
        ({"pad_is_eot": True}, "padding"),
        ({"eos_has_eot": False}, "generation_config"),
    ],
)
def test_each_fault_alone(demo_run, tmp_path, fault, check):
    settings = {"eot_untrained": False, "pad_is_eot": False, "eos_has_eot": True, **fault}
    report = doctor.diagnose(write_model(tmp_path / "m", demo_run, **settings))
    assert [f["check"] for f in report["findings"] if f["level"] == "problem"] == [check]


def test_passes_a_healthy_model(demo_run, tmp_path, cli):
    folder = write_model(
        tmp_path / "ok", demo_run, eot_untrained=False, pad_is_eot=False, eos_has_eot=True
    )
    report = doctor.diagnose(folder)
    assert report["healthy"], report["findings"]
    result = cli("doctor", folder, "--json")
    assert result.code == 0 and json.loads(result.out)["healthy"]


def test_template_token_missing_from_the_tokenizer(demo_run, tmp_path):
    folder = write_model(
        tmp_path / "t", demo_run, eot_untrained=False, pad_is_eot=False, eos_has_eot=True
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("<|eot|>", "<|im_end|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    report = doctor.diagnose(folder)
    assert any(
        f["check"] == "chat template" and "<|im_end|>" in f["what"]
        for f in report["findings"]
        if f["level"] == "problem"
    )


@pytest.fixture(scope="module")
def healthy(demo_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("doctor") / "ok"
    return write_model(folder, demo_run, eot_untrained=False, pad_is_eot=False, eos_has_eot=True)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_model_folder_is_a_user_error(healthy, tmp_path, cli, damage):
    folder, phrase = damaged_copy(healthy, tmp_path / "m", damage)
    assert_user_error(cli("doctor", folder), phrase)


def test_not_a_model_folder(tmp_path, cli):
    assert_user_error(cli("doctor", tmp_path), "not a Hugging Face model folder")
    (tmp_path / "config.json").write_text("{}")
    assert_user_error(cli("doctor", tmp_path), "no safetensors")
