"""Run by tests/integration/test_loss.py under torchrun (2 gloo ranks): a tiny model wrapped by
hanlm.train.parallel (DDP or FSDP2), each rank on its half of a batch, the chunked loss; rank 0
writes the summed loss and every parameter's gradient next to those of one process computing
the unchunked float32 cross-entropy of the whole batch.

    torchrun --nproc_per_node 2 tests/support/loss_ranks.py MODE CHUNK_TOKENS OUT.pt
"""

import sys

import torch
import torch.nn.functional as F

from hanlm.model import build_model, model_config
from hanlm.train import parallel
from hanlm.train.loss import IGNORE, TokenLoss

VOCAB, SEQ, ROWS = 101, 16, 4


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, VOCAB, (ROWS, SEQ), generator=generator)
    labels = inputs.roll(-1, dims=1)
    labels[:, -1] = IGNORE
    labels[0, :7] = IGNORE  # a prompt, as SFT masks it
    return inputs, labels


def main() -> None:
    mode, chunk_tokens, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    d = parallel.init("cpu")
    config = model_config("tiny", vocab_size=VOCAB, seq_len=SEQ)
    model = parallel.parallelize(build_model(config, seed=0), d, mode)
    inputs, labels = batch()
    mine = slice(d.rank * ROWS // d.world_size, (d.rank + 1) * ROWS // d.world_size)
    sums = model(labels=labels[mine], loss_fn=TokenLoss(chunk_tokens).sums, input_ids=inputs[mine])
    sums["loss"].backward()  # DDP and FSDP2 average the ranks' gradients
    total = parallel.all_reduce_sum(sums["loss"].detach().clone(), d)
    grads = {}
    for name, p in parallel.unwrap(model).named_parameters():
        grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad

    reference = build_model(config, seed=0)
    logits = reference(input_ids=inputs).logits
    expected = F.cross_entropy(
        logits.float().view(-1, VOCAB), labels.view(-1), ignore_index=IGNORE, reduction="sum"
    )
    (expected / d.world_size).backward()  # the ranks' average of their sums
    if d.is_main:
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
    parallel.shutdown(d)


if __name__ == "__main__":
    main()
