"""On each of 2 gloo ranks (run by two_rank_checks.py): builds the pretraining model as FSDP
does (on the meta device, sharded, then initialised), gathers its full state dict and compares it
bit for bit with the eager `build_model` of the same seed.

A variant with "loaded" instead fills the sharded meta model from a saved folder as SFT does
(parallel.parallelize_loaded, hanlm.train.pretrained).
Each rank writes OUT_DIR/rank-R.json: per variant, whether the meta path was taken, the names
of tensors that differ, whether the head is still tied, and the largest fraction of a full
parameter that this rank holds.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hanlm import model as model_lib
from hanlm.config import Config
from hanlm.train import parallel, precision, pretrain, pretrained
from hanlm.train.build import Placement

VOCAB = 96

VARIANTS = [
    {"seed": 3},
    # FP8 conversion, activation checkpointing and compile all applied on the meta model
    {
        "seed": 5,
        "preset": "demo",
        "precision": "fp8-emulate",
        "fsdp_float8_all_gather": True,
        "activation_checkpointing": "selective",
        "compile": True,
    },
    {"seed": 4, "loaded": True},
]


def check(dist: parallel.Dist, variant: dict, out: Path) -> dict:
    cfg = Config.model_validate(
        {
            "model": {"preset": variant.get("preset", "tiny")},
            "run": {"seed": variant["seed"]},
            "pretrain": {"seq_len": 32, "micro_batch": 1, "global_batch_tokens": 64},
            "precision": {"mode": variant.get("precision", "fp32")},
            "parallel": {
                "device": "cpu",
                "activation_checkpointing": variant.get("activation_checkpointing", "none"),
                "compile": variant.get("compile", False),
                "fsdp_float8_all_gather": variant.get("fsdp_float8_all_gather", False),
            },
        }
    )
    numerics = precision.resolve(cfg.precision.mode, dist.device, recipe=cfg.precision.fp8_recipe)
    at = Placement(dist, "fsdp", numerics)
    mconfig = model_lib.model_config(cfg.model.preset, vocab_size=VOCAB, seq_len=32)
    if variant.get("loaded"):  # SFT's way: built on meta, sharded, each rank reading its rows
        meta_init, converted = True, []
        folder = out / f"saved-by-rank-{dist.rank}"
        folder.mkdir()
        saved = model_lib.build_model(mconfig, seed=cfg.run.seed)
        save_model(saved, str(folder / "model.safetensors"))  # a tied tensor once
        shell = model_lib.build_model(mconfig, device="meta")
        fill = lambda m: pretrained.fill(m, "hf", folder)  # noqa: E731
        model = parallel.parallelize_loaded(shell, dist, "fsdp", fill=fill)
    else:
        _, meta_init = pretrain._new_model(mconfig, cfg.run.seed, at)
        _, model, converted = pretrain._built_model(cfg, VOCAB, at)
    model = parallel.unwrap(model)  # the causal LM inside the loss's root (hanlm.train.loss)

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    eager = model_lib.build_model(mconfig, seed=cfg.run.seed)
    expected = eager.state_dict()
    differ = sorted(k for k in expected if k not in full or not torch.equal(full[k], expected[k]))
    eager_buffers = dict(eager.named_buffers())
    differ += [k for k, b in model.named_buffers() if not torch.equal(b, eager_buffers[k])]
    largest_share = max(
        p.to_local().numel() / p.numel() for p in model.parameters() if p.shape[0] > 1
    )
    return {
        "meta": meta_init is not None,
        "training": model.training,
        "fp8_layers": len(converted),
        "differ": differ,
        "compared": len(expected),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "on_meta": [n for n, p in model.named_parameters() if p.is_meta],
        "largest_share": largest_share,
    }


def run(dist: parallel.Dist, out: Path) -> None:
    results = [check(dist, variant, out) for variant in VARIANTS]
    (out / f"rank-{dist.rank}.json").write_text(json.dumps(results))
