"""The training mix: each corpus source's share of the training windows, realised exactly and
deterministically when training reads the shards.

The shards keep each source's tokens in its own files (hanlm.data.shards), encoded once. The
mix is an order over their windows (the loader's samples, `seq_len + 1` tokens inside one file),
as Megatron's and nanotron's blended datasets make one: changing a weight, a token count or the
training length re-plans the order in milliseconds and never re-encodes.

Shares. The budget is the windows training reads: steps x global batch / seq_len. A source with
`tokens` takes ceil(tokens / seq_len) windows first; the weighted sources share the rest by their
weights (largest remainders, so the counts add up to the budget exactly). A source drawn more
often than it has windows is repeated: `epochs` = drawn / windows, an error past its max_epochs,
a warning past EPOCHS_WARNING (Muennighoff et al. 2023: repeated tokens lose most of their worth
after ~4 epochs).

Order. Per pass over the budget (the loader's epoch) each source's draws are seeded
permutations of its windows, one after another (so every window is drawn floor(epochs) or
ceil(epochs) times, a seeded subset when epochs < 1); the sources are then interleaved by
spreading each source's draws evenly (draw k of a source with n draws at (k + 0.5) / n, all
sorted): every prefix of the order holds each source's share to within one window, and a
source with share w appears in every run of ceil(1 / w) + (number of sources) windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hanlm.config import EPOCHS_WARNING, CorpusSourceSection
from hanlm.data.manifest import source_windows
from hanlm.errors import UserError


@dataclass(frozen=True)
class SourceShare:
    """One source in the mix: what was asked, what it has and what is drawn per pass."""

    name: str
    weight: float | None
    tokens: int | None
    max_epochs: float
    windows: int  # windows of seq_len + 1 tokens in its training files
    drawn: int  # windows drawn per pass over the budget

    @property
    def epochs(self) -> float:
        return self.drawn / self.windows if self.windows else math.inf


@dataclass(frozen=True)
class Mixture:
    sources: tuple[SourceShare, ...]
    seq_len: int

    @property
    def total(self) -> int:
        return sum(s.drawn for s in self.sources)

    def rows(self) -> list[dict]:
        """The table every report shows: per source, its asked and realised share, tokens and
        epochs."""
        return [
            {
                "source": s.name,
                "weight": s.weight,
                "tokens_asked": s.tokens,
                "share": round(s.drawn / max(self.total, 1), 6),
                "windows": s.windows,
                "drawn": s.drawn,
                "tokens": s.drawn * self.seq_len,
                "epochs": round(s.epochs, 4),
                "max_epochs": s.max_epochs,
            }
            for s in self.sources
        ]

    def over_warning(self) -> list[SourceShare]:
        return [s for s in self.sources if s.epochs > EPOCHS_WARNING]

    def order(self, source_ids: list[np.ndarray], seed: int, epoch: int, shuffle: bool):
        """The pass `epoch` over the budget: sample ids (from `source_ids`, each source's
        windows in the loader's numbering) in the interleaved order described above."""
        picks, times = [], []
        for index, (share, ids) in enumerate(zip(self.sources, source_ids, strict=True)):
            n, windows = share.drawn, len(ids)
            if n == 0:
                continue
            passes = -(-n // windows)
            if shuffle:
                draws = np.concatenate(
                    [
                        np.random.default_rng([seed, epoch, index, k]).permutation(windows)
                        for k in range(passes)
                    ]
                )[:n]
            else:
                draws = np.arange(n, dtype=np.int64) % windows
            picks.append(np.asarray(ids, dtype=np.int64)[draws])
            times.append((np.arange(n, dtype=np.float64) + 0.5) / n)
        # stable: at equal times the source listed first goes first
        order = np.argsort(np.concatenate(times), kind="stable")
        return np.concatenate(picks)[order]


def for_training(cfg, shards_dir) -> Mixture | None:
    """The mix pretraining reads (None: one pile, read as it is), planned on the shards' windows
    for the whole run's budget (steps x global_batch_tokens); a UserError when a share cannot
    be met."""
    sources = list(cfg.corpus.sources)  # (a flat corpus.inputs is one source, never mixed)
    if not any(s.mixed for s in sources):
        return None
    pretrain = cfg.pretrain
    steps = pretrain.steps()
    if steps is None:
        raise UserError("pretraining needs a length", fix="give --max-steps N or --max-tokens N")
    budget = steps * pretrain.global_batch_tokens // pretrain.seq_len
    windows = source_windows(shards_dir, pretrain.seq_len)
    return plan(sources, windows, budget, pretrain.seq_len)


def plan(
    sources: list[CorpusSourceSection], windows: dict[str, int], budget: int, seq_len: int
) -> Mixture:
    """The windows each source gives to a budget of `budget` windows; a UserError naming the
    sources whose share cannot be met within their max_epochs (or that have no windows)."""
    missing = [s.name for s in sources if windows.get(s.name, 0) == 0]
    if missing:
        raise UserError(
            f"corpus source(s) {', '.join(missing)} have no training window of seq_len + 1 = "
            f"{seq_len + 1} tokens in the shards",
            fix="give the source more text (or longer documents), or leave it out",
        )
    fixed = {s.name: -(-s.tokens // seq_len) for s in sources if s.tokens is not None}
    rest = budget - sum(fixed.values())
    if rest < 0:
        raise UserError(
            f"the sources' token counts ({sum(fixed.values()) * seq_len:,} tokens) exceed the "
            f"training budget ({budget * seq_len:,} tokens: steps x global_batch_tokens)",
            fix="lower the sources' tokens, or train longer",
        )
    weighted = [s for s in sources if s.weight is not None]
    drawn = dict(fixed)
    if weighted:
        total_weight = sum(s.weight for s in weighted)
        exact = [rest * s.weight / total_weight for s in weighted]
        counts = [math.floor(x) for x in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
        for i in by_remainder[: rest - sum(counts)]:
            counts[i] += 1
        drawn.update((s.name, n) for s, n in zip(weighted, counts, strict=True))
    mixture = Mixture(
        tuple(
            SourceShare(s.name, s.weight, s.tokens, s.max_epochs, windows[s.name], drawn[s.name])
            for s in sources
        ),
        seq_len,
    )
    short = [s for s in mixture.sources if s.epochs > s.max_epochs + 1e-9]
    if short:
        raise UserError(
            "the mix cannot be met within max_epochs: "
            + "; ".join(_shortfall(s, mixture, budget) for s in short),
            fix="raise the source's max_epochs, lower its share, give it more text, or train "
            "on fewer tokens",
        )
    return mixture


def _shortfall(s: SourceShare, mixture: Mixture, budget: int) -> str:
    seq = mixture.seq_len
    most = math.floor(s.windows * s.max_epochs)
    asked = f"weight {s.weight:g}" if s.weight is not None else f"{s.tokens:,} tokens"
    return (
        f"source {s.name!r} ({asked}) needs {s.drawn * seq:,} tokens, {s.epochs:.2f} epochs of "
        f"its {s.windows * seq:,}, more than its max_epochs {s.max_epochs:g}; within them it "
        f"gives {most * seq:,} tokens, {most / max(budget, 1):.1%} of the budget instead of "
        f"{s.drawn / max(budget, 1):.1%}"
    )


def token_shares(sources: list[CorpusSourceSection], budget_tokens: float) -> dict[str, float]:
    """The training tokens each source of a mix is asked for: its token count, or its weight's
    share of what the counts leave of the budget."""
    fixed = sum(s.tokens for s in sources if s.tokens is not None)
    rest = max(budget_tokens - fixed, 0.0)
    total_weight = sum(s.weight for s in sources if s.weight is not None) or 1.0
    return {
        s.name: float(s.tokens) if s.tokens is not None else rest * (s.weight or 0) / total_weight
        for s in sources
    }


def preview(
    sources: list[CorpusSourceSection], available: dict[str, float | None], budget_tokens: float
) -> list[dict]:
    """Before any data exists (`hanlm plan`): each source's tokens in the mix, the tokens it is
    estimated to have (None: not sized), the epochs that makes, and by how much of the budget
    the mix falls short where max_epochs caps a source."""
    shares = token_shares(sources, budget_tokens)
    rows = []
    for s in sources:
        want = shares[s.name]
        have = available.get(s.name)
        epochs = want / have if have else None
        possible = min(want, have * s.max_epochs) if have else None
        short = (want - possible) / budget_tokens if possible is not None and budget_tokens else 0
        rows.append(
            {
                "source": s.name,
                "weight": s.weight,
                "tokens_asked": s.tokens,
                "tokens": round(want),
                "available": round(have) if have is not None else None,
                "epochs": round(epochs, 3) if epochs is not None else None,
                "max_epochs": s.max_epochs,
                "short_of_budget": round(short, 4),
            }
        )
    return rows
