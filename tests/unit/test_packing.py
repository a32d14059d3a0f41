"""Packed documents that do not see each other: a packed row's logits and loss equal its parts'.

SFT packs whole conversations into a row; pretraining with pretrain.document_masking splits a
window at the end-of-document token. Each document must then be computed exactly as if it were
alone (fp32, within 1e-5), through the real loaders, the model's attention implementations and
the Trainer's loss; without masking the pretraining batches stay what they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hanlm import model as model_lib
from hanlm import pipeline
from hanlm.config import Config, load_config
from hanlm.data import chat_data, packing
from hanlm.data.loader import TokenLoader
from hanlm.errors import UserError
from hanlm.stages.stage import declared_settings
from hanlm.train import build, document_attention, parallel, precision

VOCAB = 64
EOD = 1
PAD = 2
SEQ_LEN = 24


def tiny_model(attention: str = "sdpa"):
    config = model_lib.model_config("tiny", vocab_size=VOCAB, seq_len=64)
    model = model_lib.build_model(config, seed=3).eval()
    if attention != "sdpa":
        model.set_attn_implementation(attention)
    return model


def logits_of(model, inputs: torch.Tensor, extra: dict | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=inputs, **document_attention.model_inputs(model, extra)).logits


def documents_of(positions: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each document of a row of positions."""
    starts = [int(i) for i in np.flatnonzero(positions == 0)]
    return list(zip(starts, [*starts[1:], len(positions)], strict=True))


def assert_each_document_as_if_alone(model, inputs, extra, atol: float = 1e-5) -> int:
    """Every document of every row has the logits it has alone; returns how many were checked."""
    packed = logits_of(model, inputs, extra)
    positions = extra["position_ids"].cpu().numpy()
    checked = 0
    for row in range(len(inputs)):
        for start, stop in documents_of(positions[row]):
            alone = logits_of(model, inputs[row : row + 1, start:stop])[0]
            torch.testing.assert_close(packed[row, start:stop], alone, rtol=0, atol=atol)
            checked += 1
    return checked


# --- positions ------------------------------------------------------------------------------------


def test_positions_restart_after_each_end_of_document():
    tokens = np.array([[5, EOD, 7, 8, EOD, EOD, 3], [4, 4, 4, 4, 4, 4, 4]])
    positions = packing.positions_after_separator(tokens, EOD)
    assert positions.tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 1, 2, 3, 4, 5, 6]]
    assert packing.extra_model_inputs(positions)["position_ids"].dtype == np.int64
    # rows of one document each need nothing: plain causal attention is already exact
    assert packing.extra_model_inputs(positions[1:]) == {}


def conversation(rng, length: int) -> tuple[list[int], list[bool]]:
    ids = rng.integers(3, VOCAB, size=length).tolist()
    mask = [False] * (length // 2) + [True] * (length - length // 2)  # the answer is the tail
    return ids, mask


def test_packed_sft_rows_restart_positions_at_each_conversation():
    rng = np.random.default_rng(0)
    examples = [conversation(rng, n) for n in (6, 9, 7, 20)]
    ids, mask, positions, too_long = chat_data.build_rows(examples, SEQ_LEN, PAD, packing=True)
    assert too_long == 0 and ids.shape == mask.shape == positions.shape == (2, SEQ_LEN + 1)
    # row 0 packs 6 + 9 + 7 of its 25 tokens, row 1 the 20; the padding continues a row's last
    # conversation, so it starts no document of its own
    assert positions[0].tolist() == [*range(6), *range(9), *range(7), 7, 8, 9]
    assert positions[1].tolist() == list(range(SEQ_LEN + 1))
    _, _, unpacked, _ = chat_data.build_rows(examples, SEQ_LEN, PAD, packing=False)
    assert unpacked is None


# --- SFT: packed rows through the chat loader ----------------------------------------------------


def packed_chat_loader(micro_batch: int = 3, **kwargs):
    rng = np.random.default_rng(1)
    examples = [conversation(rng, int(n)) for n in rng.integers(3, 12, size=14)]
    ids, mask, positions, _ = chat_data.build_rows(examples, SEQ_LEN, PAD, packing=True)
    loader = chat_data.ChatLoader(ids, mask, positions, micro_batch=micro_batch, **kwargs)
    return loader, examples


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_sft_row_logits_equal_each_conversation_alone(attention):
    loader, _ = packed_chat_loader(shuffle=False)
    inputs, _, extra = loader.next_batch()
    assert set(extra) == {"position_ids"} and extra["position_ids"].shape == inputs.shape
    assert assert_each_document_as_if_alone(tiny_model(attention), inputs, extra) > len(inputs)


def test_without_the_mask_conversations_would_see_each_other():
    """The check above can fail: a plain causal call gives later conversations other logits."""
    loader, _ = packed_chat_loader(shuffle=False)
    inputs, _, extra = loader.next_batch()
    model = tiny_model()
    plain = logits_of(model, inputs)
    start, stop = documents_of(extra["position_ids"][0].numpy())[1]
    alone = logits_of(model, inputs[:1, start:stop])[0]
    assert (plain[0, start:stop] - alone).abs().max() > 1e-3


def test_a_row_of_one_document_is_unaffected():
    model = tiny_model()
    inputs = torch.randint(3, VOCAB, (2, SEQ_LEN))
    one_document = {"position_ids": torch.arange(SEQ_LEN).expand(2, -1).clone()}
    torch.testing.assert_close(
        logits_of(model, inputs, one_document), logits_of(model, inputs), rtol=0, atol=1e-6
    )


def flex_model(device: str):
    model = tiny_model().to(device)
    chosen = document_attention.prepare(model, torch.device(device), "flex", setting="t")
    assert chosen == "flex_attention"
    return model


def test_flex_block_mask_is_each_document_causal():
    """The BlockMask given to flex attention allows exactly what the SDPA mask allows: each
    token sees the earlier tokens of its own document. Checked element by element and through
    flex attention's eager kernel; torch's compiled CPU kernel is not used, as it is wrong some
    of the time on some CPUs (an AVX2 AMD EPYC, torch 2.13) for plain causal attention too."""
    from torch.nn.attention.flex_attention import create_mask, flex_attention

    model = flex_model("cpu")
    loader, _ = packed_chat_loader(shuffle=False)
    inputs, _, extra = loader.next_batch()
    block_mask = document_attention.model_inputs(model, extra)["attention_mask"]
    assert type(block_mask).__name__ == "BlockMask"
    expected = torch.zeros(len(inputs), 1, SEQ_LEN, SEQ_LEN, dtype=torch.bool)
    for row, positions in enumerate(extra["position_ids"].numpy()):
        for start, stop in documents_of(positions):
            expected[row, 0, start:stop, start:stop] = torch.ones(stop - start, stop - start).tril()
    assert sum(len(documents_of(p)) for p in extra["position_ids"].numpy()) > len(inputs)
    allowed = create_mask(block_mask.mask_mod, len(inputs), None, SEQ_LEN, SEQ_LEN, device="cpu")
    assert torch.equal(allowed, expected)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(inputs), 4, SEQ_LEN, 16, generator=generator) for _ in range(3))
    torch.testing.assert_close(
        flex_attention(q, k, v, block_mask=block_mask),
        F.scaled_dot_product_attention(q, k, v, attn_mask=expected),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention's kernel runs on CUDA")
def test_flex_attention_keeps_documents_apart_on_cuda():
    """The whole model through flex attention's generated kernel: each document as if alone."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = flex_model("cuda")
    loader, _ = packed_chat_loader(shuffle=False)
    inputs, _, extra = loader.next_batch()
    extra = {name: tensor.cuda() for name, tensor in extra.items()}
    assert assert_each_document_as_if_alone(model, inputs.cuda(), extra, atol=1e-4) > len(inputs)


# --- pretraining: windows split at the end-of-document token -------------------------------------


def write_documents(shards_dir: Path, lengths: list[int], seed: int = 0) -> Path:
    """One train file of documents of `lengths` tokens, each ending with EOD."""
    shards_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pieces = [np.append(rng.integers(3, VOCAB, size=n - 1), EOD) for n in lengths]
    tokens = np.concatenate(pieces).astype(np.uint16)
    tokens.tofile(shards_dir / "train-00000.bin")
    entry = {
        "path": "train-00000.bin",
        "source": "corpus",
        "tokens": len(tokens),
        "documents": len(lengths),
    }
    manifest = {
        "format": 2,
        "dtype": "uint16",
        "vocab_size": VOCAB,
        "tokenizer_sha256": "sha",
        "eod_id": EOD,
        "splits": {"train": {"files": [entry], "tokens": len(tokens), "documents": len(lengths)}},
    }
    (shards_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return shards_dir


@pytest.fixture
def document_shards(tmp_path: Path) -> Path:
    lengths = np.random.default_rng(2).integers(2, 30, size=40).tolist()
    return write_documents(tmp_path / "shards", lengths)


def token_loader(shards: Path, **kwargs) -> TokenLoader:
    return TokenLoader.from_shards(shards, seq_len=SEQ_LEN, micro_batch=4, seed=5, **kwargs)


def test_pretraining_windows_with_document_masking_equal_each_document_alone(document_shards):
    loader = token_loader(document_shards, document_masking=True)
    inputs, _, extra = loader.next_batch()
    positions = extra["position_ids"].cpu().numpy()
    # a document starts after every end-of-document token of the inputs, and nowhere else
    assert ((positions[:, 1:] == 0) == (inputs[:, :-1] == EOD).numpy()).all()
    assert assert_each_document_as_if_alone(tiny_model(), inputs, extra) > len(inputs)


def test_pretraining_without_document_masking_is_unchanged(document_shards):
    plain, masked = (
        token_loader(document_shards),
        token_loader(document_shards, document_masking=True),
    )
    for _ in range(3):
        batch, with_masking = plain.next_batch(), masked.next_batch()
        assert len(batch) == 2  # (inputs, labels) as before: no extra model inputs
        torch.testing.assert_close(batch[0], with_masking[0], rtol=0, atol=0)
        torch.testing.assert_close(batch[1], with_masking[1], rtol=0, atol=0)
    # the order and the resume state do not depend on it
    assert plain.state_dict() == masked.state_dict()


def test_resume_with_document_masking_is_exact(document_shards):
    a = token_loader(document_shards, document_masking=True)
    for _ in range(3):
        a.next_batch()
    b = token_loader(document_shards, document_masking=True)
    b.load_state_dict(a.state_dict())
    for _ in range(4):
        x, y = a.next_batch(), b.next_batch()
        assert len(x) == len(y)
        for u, v in zip(x[:2], y[:2], strict=True):
            assert torch.equal(u, v)
        if len(x) == 3:
            assert torch.equal(x[2]["position_ids"], y[2]["position_ids"])


def test_windows_of_one_document_carry_nothing_extra(tmp_path):
    shards = write_documents(tmp_path / "one", [500])  # one long document: no boundary inside
    batch = token_loader(shards, document_masking=True, shuffle=False).next_batch()
    assert len(batch) == 2


def test_a_manifest_without_an_end_of_document_id_is_refused(document_shards):
    path = document_shards / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["eod_id"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="end-of-document") as err:
        token_loader(document_shards, document_masking=True)
    assert "pretrain.document_masking = false" in err.value.fix
    token_loader(document_shards)  # without masking the id is not needed


# --- the Trainer's loss -----------------------------------------------------------------------------


def trainer_for(model, train_loader, val_loader, tmp_path: Path):
    cpu = torch.device("cpu")
    job = build.TrainingJob(
        total_steps=1,
        accumulation=1,
        train_loader=train_loader,
        val_loader=val_loader,
        checkpoints_dir=tmp_path / "checkpoints",
        checkpoints_place="run/sft",
        metrics_path=tmp_path / "metrics.jsonl",
        flops_per_token=1.0,
        fingerprint="f",
        settings="s",
        student_tokenizer=tmp_path,
    )
    at = build.Placement(parallel.Dist(0, 1, 0, cpu), "single", precision.resolve("fp32", cpu))
    return build.build_trainer(model, job, at, build.Components.sft(Config()))


def summed_loss_of_parts(model, inputs, labels, extra) -> tuple[float, int]:
    """Cross-entropy summed over the rows' documents, each run alone, and the tokens counted."""
    total, tokens = 0.0, 0
    for row in range(len(inputs)):
        for start, stop in documents_of(extra["position_ids"][row].numpy()):
            logits = logits_of(model, inputs[row : row + 1, start:stop])[0]
            part = labels[row, start:stop]
            total += F.cross_entropy(logits, part, ignore_index=-100, reduction="sum").item()
            tokens += int((part != -100).sum())
    return total, tokens


def test_loss_over_a_packed_batch_is_the_sum_of_the_parts_losses(tmp_path):
    model = tiny_model().train()
    rows = 3
    train_loader, _ = packed_chat_loader(micro_batch=rows, shuffle=False)
    val_loader, _ = packed_chat_loader(micro_batch=rows, shuffle=False)
    inputs, labels, extra = val_loader.next_batch()  # the rows both loaders start with
    val_loader, _ = packed_chat_loader(micro_batch=rows, shuffle=False)
    expected, tokens = summed_loss_of_parts(model, inputs, labels, extra)
    assert tokens == int((labels != -100).sum())

    trainer = trainer_for(model, train_loader, val_loader, tmp_path)
    trainer.settings.eval_batches = 1
    assert trainer.evaluate()["val_loss"] == pytest.approx(expected / tokens, rel=1e-5)
    out = trainer.train_step()  # its loss is taken before the update
    assert out["tokens"] == tokens
    assert out["loss_sum"].item() == pytest.approx(expected, rel=1e-5)


# --- choosing the attention, and the settings ------------------------------------------------------


def test_the_portable_path_is_sdpa_and_cuda_prefers_flex():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert document_attention.prepare(tiny_model(), cpu, "auto", setting="t") == "sdpa"
    assert document_attention.prepare(tiny_model(), cuda, "sdpa", setting="t") == "sdpa"
    # the choice is made from the device's type alone: no GPU is touched
    assert document_attention.prepare(tiny_model(), cuda, "auto", setting="t") == "flex_attention"
    eager = tiny_model("eager")
    assert document_attention.prepare(eager, cpu, "auto", setting="t") == "sdpa"
    assert eager.config._attn_implementation == "sdpa"


def test_models_that_cannot_mask_documents_are_refused():
    from transformers import AutoModelForCausalLM, MambaConfig, MistralConfig

    small = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 1}
    mistral = MistralConfig(
        **small, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
    )
    mamba = MambaConfig(**small, state_size=4)
    for config, needle in ((mistral, "sliding window"), (mamba, "layers")):
        model = AutoModelForCausalLM.from_config(config)
        with pytest.raises(UserError, match=needle) as err:
            document_attention.prepare(model, torch.device("cpu"), setting="sft.packing")
        assert "sft.packing = false" in err.value.fix


def test_settings_load_old_configs_and_refuse_bad_values():
    assert load_config(values={}).pretrain.document_masking is False  # old configs lack the key
    assert load_config(values={}).parallel.document_attention == "auto"
    cfg = load_config(values={"pretrain.document_masking": True})
    assert cfg.pretrain.document_masking is True
    with pytest.raises(UserError, match="document_masking"):
        load_config(values={"pretrain.document_masking": "maybe"})
    with pytest.raises(UserError, match="document_attention"):
        load_config(overrides=["parallel.document_attention=fast"])


def test_masking_is_part_of_the_pretraining_fingerprint():
    stage = pipeline.declaration("pretrain")
    off = declared_settings(load_config(values={}), stage)
    on = declared_settings(load_config(values={"pretrain.document_masking": 1}), stage)
    assert off["pretrain"]["document_masking"] is False
    assert on["pretrain"] == {**off["pretrain"], "document_masking": True}
