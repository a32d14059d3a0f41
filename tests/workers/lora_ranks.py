"""A few AdamW steps of LoRA SFT on a tiny tied model, alone or on FSDP2 ranks.

The adapters on every block's attention and MLP layers, and the trainable rows of NEW_IDS (which
sit on both sides of the rows' shard boundary), placed as `hanlm.train.sft` places a LoRA model
(`parallel.parallelize_whole` after PEFT's injection). tests/integration/test_two_ranks.py calls
`train` for the one-process reference; on 2 gloo ranks (two_rank_checks.py) `run` saves the
sharded training's full trainable tensors (rank 0) to OUT_DIR/sharded.pt.
"""

from pathlib import Path

import torch

from hanlm.config import SftLoraSection
from hanlm.model import build_model, model_config
from hanlm.train import lora, optim, parallel
from hanlm.train.loss import TokenLoss, with_loss

VOCAB = 301  # 151 / 150 rows a rank
NEW_IDS = (5, 150, 151, 300)
STEPS = 3


def injected():
    config = model_config("tiny", vocab_size=VOCAB, seq_len=32)
    _, model = lora.Adapters(SftLoraSection(rank=4), NEW_IDS).inject(build_model(config, seed=0))
    return model


def batches() -> list[torch.Tensor]:
    """The same batches for every rank, so that FSDP's averaged gradient is one process's."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.tensor([list(NEW_IDS)] * 4)
    return [
        torch.cat([ids, torch.randint(0, VOCAB, (4, 12), generator=generator)], 1)
        for _ in range(STEPS)
    ]


def train(root) -> dict[str, torch.Tensor]:
    """Every tensor of the model (full, on the CPU) after STEPS steps of AdamW on the trainable
    ones; `root` is the placed model (parallelize's) or the plain injected one."""
    root = with_loss(root)
    model = parallel.unwrap(root)
    optimizer = optim.adamw(
        model, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, device="cpu"
    )
    for batch in batches():
        inputs, labels = batch[:, :-1], batch[:, 1:]
        root(labels=labels, loss_fn=TokenLoss().sums, input_ids=inputs)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: full(p) for name, p in model.named_parameters()}


def full(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).clone()


def run(dist: parallel.Dist, out: Path) -> None:
    result = train(parallel.parallelize_whole(injected(), dist, "fsdp"))
    if dist.is_main:
        torch.save(result, out / "sharded.pt")
