"""Run by tests/integration/test_sft_loading.py under torchrun (2 gloo ranks): SFT's start as `hanlm sft`
makes it (hanlm.train.sft: the model built on meta, placed, filled from the source by parts,
its new chat-token rows initialised), compared with the one-process way (the whole source
model loaded, its rows initialised) bit for bit, then both trained a few steps with the new
rows' step scaled (`sft.new_token_lr_scale`).

Usage: torchrun --nproc_per_node 2 tests/workers/sft_load_worker.py OUT_DIR VARIANT_JSON...
A variant names the source ({"kind": "hf" | "checkpoint", "path": ...}), "mode" (fsdp, ddp),
"init" and optionally "precision" (fp8-emulate: loading only) and "train_steps".
Each rank writes OUT_DIR/rank-R.json: per variant, the tensors that differ after loading, the
largest difference after training, whether the head is still tied, and the largest fraction
of a full parameter this rank holds.
"""

import json
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hanlm.chat import tokens
from hanlm.config import Config
from hanlm.model import model_config
from hanlm.train import parallel, precision, sft
from hanlm.train.loss import TokenLoss, with_loss
from hanlm.train.results import TokenAudit

VOCAB = 301  # 151 / 150 rows a rank: the new rows sit on both sides of the boundary
SPECIAL = {
    "system": {"id": 5},
    "user": {"id": 150},
    "assistant": {"id": 151},
    "eot": {"id": 300},
    "reserved": [{"id": 7}, {"id": 8}, {"id": 9}],
}
# the one field of the audit that initialise_rows reads
AUDIT = TokenAudit.model_construct(untrained_template_tokens=["system", "user", "assistant", "eot"])
SCALE = 5.0


def source_config(tied: bool):
    config = model_config("tiny", vocab_size=VOCAB, seq_len=32)
    config.tie_word_embeddings = tied
    return config


def full_state(model) -> dict[str, torch.Tensor]:
    options = StateDictOptions(full_state_dict=True)
    return {k: v.detach().clone() for k, v in get_model_state_dict(model, options=options).items()}


def batches(steps: int) -> list[torch.Tensor]:
    """The same rows on every rank, so that the ranks' averaged gradient is one process's."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (4, 17), generator=generator) for _ in range(steps)]


def train(root, steps: int) -> dict[str, torch.Tensor]:
    causal_lm = parallel.unwrap(root)
    optimizer = torch.optim.AdamW(root.parameters(), lr=1e-2, weight_decay=0.0)
    tokens.RowStepScale(optimizer, causal_lm, [s["id"] for s in list(SPECIAL.values())[:4]], SCALE)
    for batch in batches(steps):
        loss = root(labels=batch[:, 1:], loss_fn=TokenLoss().sums, input_ids=batch[:, :-1])
        loss["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
    return full_state(causal_lm)


def check(d: parallel.Dist, variant: dict) -> dict:
    cfg = Config.model_validate(
        {
            "run": {"seed": 11},
            "precision": {"mode": variant.get("precision", "fp32")},
            "parallel": {"device": "cpu", "fsdp_float8_all_gather": True},
            "sft": {"init": variant["init"], "packing": False},
        }
    )
    source = sft.SftSource(
        kind=variant["kind"],
        path=Path(variant["path"]),
        tokenizer_dir=Path(variant["path"]),
        fingerprint="",
        model_config=source_config(variant["tied"]) if variant["kind"] == "checkpoint" else None,
    )
    numerics = precision.resolve(cfg.precision.mode, d.device, recipe=cfg.precision.fp8_recipe)
    root, _, converted = sft._placed_model(cfg, source, numerics, d, variant["mode"])
    ids, _ = sft.initialise_rows(cfg, root, source, AUDIT, SPECIAL, variant["init"])
    model = parallel.unwrap(root)
    placed = full_state(model)

    reference, _ = sft.load_source_model(source)  # the whole model, in this one process
    tokens.initialise(reference, ids, variant["init"], SPECIAL, seed=cfg.run.seed)
    expected = reference.state_dict()
    differ = sorted(k for k in expected if not torch.equal(placed[k], expected[k]))
    buffers = dict(reference.named_buffers())
    differ += [k for k, b in model.named_buffers() if not torch.equal(b, buffers[k])]
    shares = [
        (p.to_local().numel() if hasattr(p, "to_local") else p.numel()) / p.numel()
        for p in model.parameters()
        if p.shape[0] > 1
    ]
    result = {
        "differ": differ,
        "compared": len(expected),
        "fp8_layers": len(converted),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "largest_share": max(shares),
    }
    steps = variant.get("train_steps", 0)
    if steps:
        start = expected["model.embed_tokens.weight"][ids]  # a copy, before training
        trained = train(root, steps)
        alone = train(with_loss(reference), steps)
        result["rows_moved"] = float((alone["model.embed_tokens.weight"][ids] - start).abs().min())
        result["trained_max_difference"] = max(
            float((trained[k] - alone[k]).abs().max()) for k in alone
        )
    return result


def main() -> None:
    out = Path(sys.argv[1])
    variants = [json.loads(v) for v in sys.argv[2:]]
    torch.set_num_threads(1)
    d = parallel.init("cpu")
    try:
        results = [check(d, v) for v in variants]
        (out / f"rank-{d.rank}.json").write_text(json.dumps(results))
    finally:
        parallel.shutdown(d)


if __name__ == "__main__":
    main()
