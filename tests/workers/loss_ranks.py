"""On each of 2 gloo ranks (run by two_rank_checks.py): a tiny model wrapped by
hanlm.train.parallel (DDP, then FSDP2), each rank on its half of a batch, the chunked loss; rank 0
writes OUT_DIR/MODE.pt, the summed loss and every parameter's gradient next to those of one
process computing the unchunked float32 cross-entropy of the whole batch.
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from hanlm.model import build_model, model_config
from hanlm.train import parallel
from hanlm.train.loss import IGNORE, TokenLoss

VOCAB, SEQ, ROWS = 101, 16, 4
MODES = ("ddp", "fsdp")
CHUNK_TOKENS = 5  # chunks that split rows, and a last one shorter than the others


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, VOCAB, (ROWS, SEQ), generator=generator)
    labels = inputs.roll(-1, dims=1)
    labels[:, -1] = IGNORE
    labels[0, :7] = IGNORE  # a prompt, as SFT masks it
    return inputs, labels


def run(dist: parallel.Dist, out: Path) -> None:
    for mode in MODES:
        compare(dist, mode, out / f"{mode}.pt")


def compare(dist: parallel.Dist, mode: str, out: Path) -> None:
    config = model_config("tiny", vocab_size=VOCAB, seq_len=SEQ)
    model = parallel.parallelize(build_model(config, seed=0), dist, mode)
    inputs, labels = batch()
    mine = slice(dist.rank * ROWS // dist.world_size, (dist.rank + 1) * ROWS // dist.world_size)
    sums = model(labels=labels[mine], loss_fn=TokenLoss(CHUNK_TOKENS).sums, input_ids=inputs[mine])
    sums["loss"].backward()  # DDP and FSDP2 average the ranks' gradients
    total = parallel.all_reduce_sum(sums["loss"].detach().clone(), dist)
    grads = {}
    for name, p in parallel.unwrap(model).named_parameters():
        grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad

    reference = build_model(config, seed=0)
    logits = reference(input_ids=inputs).logits
    expected = F.cross_entropy(
        logits.float().view(-1, VOCAB), labels.view(-1), ignore_index=IGNORE, reduction="sum"
    )
    (expected / dist.world_size).backward()  # the ranks' average of their sums
    if dist.is_main:
        torch.save(
            {
                "loss": total,
                "expected_loss": expected.detach(),
                "grads": grads,
                "expected_grads": {n: p.grad for n, p in reference.named_parameters()},
                "tied": reference.lm_head.weight is reference.model.embed_tokens.weight,
            },
            out,
        )
