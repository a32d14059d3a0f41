"""Continued pretraining (`model.init_from`): pretraining starts from another model's weights,
architecture and tokenizer. The tokenizer stage keeps the model's tokenizer (documents end with
its eos and begin with its BOS where it adds one) or extends it (`tokenizer.extend`), the shards
follow it, and the first loss is the model's own on the same batch: the weights really were
loaded."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from foreign_models import chats, llama_model, qwen2_model

from conftest import TINY_PRETRAIN, assert_user_error, metrics, write_jsonl
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config

CONTINUED = {
    **{k: v for k, v in TINY_PRETRAIN.items() if k != "model.preset"},
    "pretrain.global_batch_tokens": 256,  # one micro-batch: the first step's loss is one batch's
    "pretrain.max_steps": 2,
    "pretrain.document_masking": False,  # transformers' plain forward is the reference
    "checkpoint.every": 2,
}


def _corpus_run(demo_run, run_dir):
    """A copy of the demo data run with its corpus only: the model brings the tokenizer."""
    keep = shutil.ignore_patterns("tokenizer", "shards", "pretrain", "sft", "eval", "report")
    shutil.copytree(demo_run, run_dir, ignore=keep)
    return run_dir


def _first_batch(run_dir, cfg):
    from hanlm.data import mixture
    from hanlm.data.loader import TokenLoader
    from hanlm.data.shards import ShardsManifest

    manifest = ShardsManifest.read(run_dir / "shards" / "manifest.json")
    loader = TokenLoader.from_shards(
        run_dir / "shards", "train", seq_len=cfg.pretrain.seq_len,
        micro_batch=cfg.pretrain.micro_batch, seed=cfg.run.seed,
        expected_tokenizer_sha256=manifest.tokenizer_sha256,
        mixture=mixture.for_training(cfg, run_dir / "shards"),  # the sources' shares, as trained
    )  # fmt: skip
    return loader.next_batch()[:2]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_first_loss_is_the_models_own_on_the_same_batch(demo_run, tmp_path, family):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = (llama_model if family == "llama" else qwen2_model)(tmp_path / family)
    run_dir = _corpus_run(demo_run, tmp_path / "run")
    cfg = load_run_config(run_dir, values={**CONTINUED, "model.init_from": str(base)})
    for stage in ("tokenizer", "shards", "pretrain"):
        run_stage(stage, cfg, run_dir)
    tok = AutoTokenizer.from_pretrained(base)
    assert (run_dir / "tokenizer" / "tokenizer.json").read_bytes() == (
        base / "tokenizer.json"
    ).read_bytes()  # kept, not trained
    special = json.loads((run_dir / "tokenizer" / "special_tokens.json").read_text())
    assert special["eod"]["id"] == tok.eos_token_id
    manifest = json.loads((run_dir / "shards" / "manifest.json").read_text())
    assert manifest["eod_id"] == tok.eos_token_id and manifest["vocab_size"] == len(tok)
    files = manifest["splits"]["train"]["files"]
    ids = np.fromfile(run_dir / "shards" / files[0]["path"], dtype=manifest["dtype"])
    # a document ends with the model's eos; the Llama's tokenizer adds <s>, which starts it
    ends = np.flatnonzero(ids == tok.eos_token_id)
    assert len(ends) == files[0]["documents"] and ends[-1] == len(ids) - 1
    if family == "llama":
        starts = np.concatenate([[0], ends[:-1] + 1])
        assert (ids[starts] == tok.bos_token_id).all()
        assert (ids == tok.bos_token_id).sum() == len(starts)  # never inside a document
        assert special["document_start"]["token"] == "<s>"
    else:
        assert special["document_start"] is None
    inputs, targets = _first_batch(run_dir, cfg)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    reference = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    ).item()
    first = next(r for r in metrics(run_dir) if r.get("step") == 1)
    assert first["loss"] == pytest.approx(reference, rel=1e-4)
    # a from-scratch model of the same shape starts near ln(vocab); these weights do not differ
    # from it in a way the test could miss, so check the loaded weights are the model's own
    summary = json.loads((run_dir / "pretrain" / "summary.json").read_text())
    assert summary["step"] == 2
    run_stage("export", cfg, run_dir)
    exported = AutoModelForCausalLM.from_pretrained(run_dir / "pretrain" / "hf")
    assert type(exported).__name__ == type(model).__name__
    assert exported.config.vocab_size == model.config.vocab_size
    # SFT of the run's checkpoint: with the model's own template (Qwen2's ChatML) as any
    # foreign model; without one, refused with the way through the export
    sft = {"sft.data": str(write_jsonl(tmp_path / "chat.jsonl", chats())), "sft.max_steps": 1,
           "sft.heldout": 4, "sft.seq_len": 128, "sft.compare": [], "decontam.enabled": False}  # fmt: skip
    cfg = load_run_config(run_dir, values={**CONTINUED, "model.init_from": str(base), **sft})
    if family == "llama":
        with pytest.raises(UserError, match="no chat template") as refused:
            run_stage("sft", cfg, run_dir)
        assert "--model" in refused.value.fix
    else:
        assert run_stage("sft", cfg, run_dir).step == 1
        audit = json.loads((run_dir / "sft" / "audit.json").read_text())
        assert audit["counts_source"] == "shard manifest"  # the run's own pretraining counted


def test_an_extended_tokenizer_adds_tokens_with_rows_from_their_pieces(demo_run, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = llama_model(tmp_path / "llama")
    old = AutoTokenizer.from_pretrained(base)
    run_dir = _corpus_run(demo_run, tmp_path / "run")
    values = {**CONTINUED, "model.init_from": str(base), "tokenizer.extend": 16,
              "pretrain.max_steps": 1, "checkpoint.every": 1}  # fmt: skip
    cfg = load_run_config(run_dir, values=values)
    stats = run_stage("tokenizer", cfg, run_dir)
    assert stats.added_tokens == 16 and stats.vocab_size == len(old) + 16
    # the added tokens are words of the corpus: each one covers more text than the pieces did
    assert stats.heldout.chars_per_token > stats.heldout_before.chars_per_token
    extension = json.loads((run_dir / "tokenizer" / "extension.json").read_text())
    new = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    for token in extension["tokens"]:
        assert new(token["token"], add_special_tokens=False).input_ids == [token["id"]]
        assert old(token["token"], add_special_tokens=False).input_ids == token["pieces"]
        assert len(token["pieces"]) >= 2
    run_stage("shards", cfg, run_dir)
    from hanlm.train import init_from

    grown = init_from._grown(base, len(new), extension, len(old))
    before = load_file(str(base / "model.safetensors"))
    for name, weight in (("model.embed_tokens.weight", grown.get_input_embeddings().weight),
                         ("lm_head.weight", grown.get_output_embeddings().weight)):  # fmt: skip
        assert weight.shape[0] == len(old) + 16
        assert weight[: len(old)].equal(before[name])  # the model's rows untouched
        for token in extension["tokens"]:  # pieces: the mean of the old rows of its pieces
            expected = before[name][torch.tensor(token["pieces"])].mean(dim=0)
            assert torch.allclose(weight[token["id"]], expected)
    run_stage("pretrain", cfg, run_dir)
    run_stage("export", cfg, run_dir)
    exported = AutoModelForCausalLM.from_pretrained(run_dir / "pretrain" / "hf")
    assert exported.get_input_embeddings().weight.shape[0] == len(old) + 16


def test_mean_rows_are_the_mean_of_the_models_rows(tmp_path):
    import torch

    from hanlm.train.init_from import new_rows

    weight = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    extension = {"init": "mean", "tokens": [{"id": 4, "pieces": [0, 1]}, {"id": 5, "pieces": [2]}]}
    assert new_rows(weight, extension, 4).tolist() == [[3.0, 4.0], [3.0, 4.0]]
    extension["init"] = "pieces"
    assert new_rows(weight, extension, 4).tolist() == [[1.0, 2.0], [4.0, 5.0]]


def test_preset_and_init_from_together_are_refused(tmp_path, cli):
    base = llama_model(tmp_path / "llama")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[model]\npreset = "tiny"\ninit_from = "{base}"\n')
    result = cli("plan", "--config", recipe)
    assert_user_error(result, "model.preset and model.init_from are both set", "drop model.preset")


def test_extend_without_init_from_is_refused(tmp_path, cli):
    result = cli("tokenizer", "--run-dir", tmp_path / "run", "--set", "tokenizer.extend=8")
    assert_user_error(result, "tokenizer.extend", "model.init_from")


@pytest.mark.slow
def test_two_rank_fsdp2_starts_from_the_same_weights_as_one_process(demo_run, tmp_path):
    """Under FSDP2 each rank reads only its shards of the model's safetensors: its losses are
    one process's on the same batches (one process accumulates what two ranks share)."""
    import os
    import subprocess
    import sys

    base = qwen2_model(tmp_path / "qwen2")
    values = {**CONTINUED, "model.init_from": str(base), "pretrain.global_batch_tokens": 512}
    single = _corpus_run(demo_run, tmp_path / "single")
    cfg = load_run_config(single, values=values)
    for stage in ("tokenizer", "shards", "pretrain"):
        run_stage(stage, cfg, single)
    ranks = shutil.copytree(single, tmp_path / "ranks", ignore=shutil.ignore_patterns("pretrain"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hanlm", "pretrain", "--run-dir", str(ranks), "--set", "parallel.mode=fsdp"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    one = {r["step"]: r["loss"] for r in metrics(single) if "loss" in r}
    two = {r["step"]: r["loss"] for r in metrics(ranks) if "loss" in r}
    assert one.keys() == two.keys() == {1, 2}
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5)
