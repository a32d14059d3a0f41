"""A few AdamW steps of a tiny model with `tokens.RowStepScale`, alone or on FSDP2 ranks.

tests/integration/test_two_ranks.py imports `train` for the one-process reference; on 2 gloo ranks
(run by two_rank_checks.py) `run` trains the sharded models and saves their full token matrices
(rank 0) to OUT_DIR/sharded.pt.
"""

from pathlib import Path

import torch

from hanlm.chat import tokens
from hanlm.model import build_model, model_config
from hanlm.train import parallel
from hanlm.train.loss import TokenLoss, with_loss

# 301 rows split 151 / 150 over 2 ranks: the new rows sit on both sides of the boundary.
VOCAB = 301
NEW_IDS = [5, 150, 151, 300]
SCALE = 5.0
STEPS = 3


def tiny(tied: bool):
    config = model_config("tiny", vocab_size=VOCAB, seq_len=32)
    config.tie_word_embeddings = tied
    return build_model(config, seed=0)


def batches() -> list[torch.Tensor]:
    """The same batches for every rank, so that FSDP's averaged gradient is one process's."""
    generator = torch.Generator().manual_seed(1)
    return [
        torch.cat(
            [
                torch.tensor([[5, 150, 151, 300]] * 4),
                torch.randint(0, VOCAB, (4, 12), generator=generator),
            ],
            1,
        )
        for _ in range(STEPS)
    ]


def train(model, scale: float, steps: int) -> dict[str, torch.Tensor]:
    """The token matrices (full, on CPU) after `steps` steps with the new rows' step scaled."""
    root = with_loss(model)  # parallelize's result ends in the loss already; a plain model not
    causal_lm = parallel.unwrap(root)
    optimizer = torch.optim.AdamW(root.parameters(), lr=1e-2, weight_decay=0.0)
    tokens.RowStepScale(optimizer, causal_lm, NEW_IDS, scale)
    for batch in batches()[:steps]:
        inputs, labels = batch[:, :-1], batch[:, 1:]
        root(labels=labels, loss_fn=TokenLoss().sums, input_ids=inputs)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: full(w) for name, w in tokens.matrices(causal_lm).items()}


def full(weight: torch.Tensor) -> torch.Tensor:
    weight = weight.detach()
    return (weight.full_tensor() if hasattr(weight, "full_tensor") else weight).clone()


def run(dist: parallel.Dist, out: Path) -> None:
    results = {}
    for tied in (True, False):
        for scale, steps in ((SCALE, STEPS), (SCALE, 1), (1.0, 1)):
            model = parallel.parallelize(tiny(tied), dist, "fsdp")
            results[(tied, scale, steps)] = train(model, scale, steps)
    if dist.is_main:
        torch.save(results, out / "sharded.pt")
