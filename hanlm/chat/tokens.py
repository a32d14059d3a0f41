"""The chat template's special tokens: are their rows trained, and how to initialise them if not.

Audit. Pretraining that never shows <|eot|> leaves its rows wherever initialisation (and, in a
tied model, the softmax's steady push away from every token it never predicts) put them; SFT
then has to teach a model to emit a token whose logit it has learned to suppress. For each
template token the audit reports how often the pretraining shards held it (the shard manifest
counts them) and the geometry of its rows: norm relative to ordinary rows, cosine to their
mean, and the under-training indicator of Land & Bartolo (2024, "Fishing for Magikarp"):

* unembedding (output head, tied or not): with `m` the mean of ordinary rows and `r` the mean
  of reference rows known to be unused (reserved special tokens), the cosine of `w - m` with
  `r - m`. Untrained rows share the push away from the hidden states, so they point the same
  way as the reference.
* input embedding (untied only): the norm relative to the ordinary rows' median; a row no
  gradient ever reached keeps its small initial norm or decays.

A token is under-trained by an indicator when its value is nearer the reference tokens'
median than the ordinary tokens' (a rule without magic numbers that carries across models).
With shard counts the verdict is the count (never seen: untrained); without them, the indicators.

Initialisation (`init`): `mean` of ordinary rows, `mean-cov` (a sample around that mean with
1e-5 times the rows' covariance, as transformers' `resize_token_embeddings(mean_resizing=True)`),
`text` (mean of the rows of a text's tokens), `none`. The input embedding and, when untied, the
output head are set separately. The rows are computed on the CPU from the whole matrix (an
FSDP2 matrix is gathered, one at a time), so every rank computes what one process does and
writes the rows of its own block.

Own learning rate. An optimizer param group cannot hold some rows of a matrix, and scaling
those rows' gradients does nothing under Adam (its update is invariant to gradient scale), so
`RowStepScale` scales the step itself: optimizer hooks remember the rows before a step and
stretch the change the step made to them by `scale`. Under FSDP2 each rank holds a block of
every matrix's rows (a DTensor sharded on dim 0) and the optimizer steps each rank's block, so
each rank stretches the new rows in its own block: the same arithmetic on the same values as
one process, with no communication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from hanlm.chat import foreign
from hanlm.chat_template import SPECIAL_TOKENS_FILE
from hanlm.console import console
from hanlm.errors import UserError
from hanlm.files import read_json

TEMPLATE_TOKENS = ("system", "user", "assistant", "eot")
INFO_TOKENS = ("pad", "eod", "bos")
INIT_METHODS = ("mean", "mean-cov", "text", "none")
COVARIANCE_SCALE = 1e-5  # transformers' mean_resizing


# --- rows and token sets --------------------------------------------------------------------------


def load_special_tokens(tokenizer_dir: Path) -> dict:
    """A hanlm tokenizer's special_tokens.json; for another model's tokenizer, the same read
    from its chat template (hanlm.chat.foreign)."""
    path = Path(tokenizer_dir) / SPECIAL_TOKENS_FILE
    if path.is_file():
        return read_json(path)
    from hanlm.inference import load_tokenizer  # deferred: transformers, for a foreign folder

    return foreign.special_tokens_of(load_tokenizer(tokenizer_dir), str(tokenizer_dir))


def is_tied(model) -> bool:
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight


def matrices(model) -> dict[str, torch.nn.Parameter]:
    """The token matrices that hold a row per token: the input embedding, and the head if untied."""
    out = {"embedding": model.get_input_embeddings().weight}
    if not is_tied(model) and model.get_output_embeddings() is not None:
        out["head"] = model.get_output_embeddings().weight
    return out


def special_ids(special: dict) -> dict[str, int]:
    return {k: v["id"] for k, v in special.items() if isinstance(v, dict) and "id" in v}


def reference_ids(special: dict) -> list[int]:
    return [r["id"] for r in special.get("reserved", [])]


def ordinary_ids(vocab_rows: int, excluded: Sequence[int]) -> np.ndarray:
    mask = np.ones(vocab_rows, dtype=bool)
    excluded = [i for i in excluded if 0 <= i < vocab_rows]
    mask[excluded] = False
    return np.flatnonzero(mask)


# --- indicators -----------------------------------------------------------------------------------


@torch.no_grad()
def row_indicators(
    weight: torch.Tensor, ids: Sequence[int], ordinary: np.ndarray, reference: Sequence[int]
) -> dict[str, list[float | None]]:
    """Per id: norm, norm / median ordinary norm, cosine to the ordinary mean, and the
    reference cosine (None without at least two reference rows)."""
    matrix = weight.detach().float().cpu()
    rows = matrix[torch.as_tensor(ordinary)]
    mean = rows.mean(0)
    median_norm = rows.norm(dim=1).median().clamp_min(1e-12)
    target = matrix[torch.as_tensor(list(ids), dtype=torch.long)]
    norms = target.norm(dim=1)
    cos_mean = torch.nn.functional.cosine_similarity(target, mean.expand_as(target), dim=1)
    out = {
        "norm": norms.tolist(),
        "norm_ratio": (norms / median_norm).tolist(),
        "cos_mean": cos_mean.tolist(),
        "cos_reference": [None] * len(ids),
    }
    reference = [r for r in reference if 0 <= r < len(matrix)]
    if len(reference) >= 2:
        values = []
        for i in ids:
            others = [r for r in reference if r != i]
            direction = matrix[torch.as_tensor(others)].mean(0) - mean
            values.append(
                float(torch.nn.functional.cosine_similarity(matrix[i] - mean, direction, dim=0))
            )
        out["cos_reference"] = values
    return out


def _midpoint(weight, ordinary: np.ndarray, reference: Sequence[int], key: str, sample: int = 512):
    """Medians of an indicator over ordinary and reference rows, and the decision point between."""
    rng = np.random.default_rng(0)
    picked = ordinary if len(ordinary) <= sample else rng.choice(ordinary, sample, replace=False)
    ordinary_values = row_indicators(weight, picked.tolist(), ordinary, reference)[key]
    reference_values = row_indicators(weight, list(reference), ordinary, reference)[key]
    if not reference_values or reference_values[0] is None:
        return None
    ordinary_median = float(np.median(ordinary_values))
    reference_median = float(np.median(reference_values))
    return {
        "ordinary_median": ordinary_median,
        "reference_median": reference_median,
        "threshold": (ordinary_median + reference_median) / 2,
        # too close together to tell anything apart
        "usable": abs(ordinary_median - reference_median) > 0.2,
    }


def geometry(model, ids: Sequence[int], special: dict, vocab_rows: int | None = None) -> dict:
    """Indicators of `ids` in every token matrix, with each indicator's decision point and a
    per-id `under_trained` flag (None when no indicator is usable)."""
    tied = is_tied(model)
    all_special = list(special_ids(special).values()) + reference_ids(special)
    weights = matrices(model)
    rows = vocab_rows or weights["embedding"].shape[0]
    ordinary = ordinary_ids(rows, all_special)
    reference = reference_ids(special)
    head_name = "embedding" if tied else "head"
    result: dict = {"tied": tied, "matrices": {}, "under_trained": [None] * len(ids)}
    for name, weight in weights.items():
        values = row_indicators(weight, ids, ordinary, reference)
        result["matrices"][name] = {"values": values}
        key = "cos_reference" if name == head_name else "norm_ratio"
        point = _midpoint(weight, ordinary, reference, key) if len(reference) >= 2 else None
        result["matrices"][name]["decision"] = {"indicator": key, **(point or {})}
        if point is None or not point["usable"]:
            continue
        higher_is_untrained = point["reference_median"] > point["ordinary_median"]
        for k, v in enumerate(values[key]):
            flag = v > point["threshold"] if higher_is_untrained else v < point["threshold"]
            previous = result["under_trained"][k]
            result["under_trained"][k] = bool(flag) or bool(previous)
    return result


@torch.no_grad()
def row_norms(model, special: dict) -> dict:
    """Per token matrix: the ordinary rows' mean and median norm, each template token's row norm,
    and the norm a row starts with (`initializer_range` x sqrt(width), when the config says).
    Trained rows grow away from the start; rows no text ever trained stay near it or shrink."""
    all_special = list(special_ids(special).values()) + reference_ids(special)
    out: dict = {}
    for name, weight in matrices(model).items():
        matrix = weight.detach().float().cpu()
        ordinary = matrix[torch.as_tensor(ordinary_ids(len(matrix), all_special))].norm(dim=1)
        out[name] = {
            "ordinary_mean": round(float(ordinary.mean()), 4),
            "ordinary_median": round(float(ordinary.median()), 4),
            "template": {
                token: round(float(matrix[special[token]["id"]].norm()), 4)
                for token in TEMPLATE_TOKENS
                if token in special and special[token]["id"] < len(matrix)
            },
        }
    init_range = getattr(getattr(model, "config", None), "initializer_range", None)
    if init_range is not None:
        out["initial_norm"] = round(init_range * math.sqrt(model.config.hidden_size), 4)
    return out


# --- the audit ------------------------------------------------------------------------------------


def audit(
    model, special: dict, pretrain_counts: dict[str, int] | None, added: Sequence[str] = ()
) -> dict:
    """A verdict per template token (and pad/eod/bos for information). `added`: tokens hanlm
    added to the vocabulary itself (hanlm.chat.template_base), untrained by construction."""
    names = [n for n in (*TEMPLATE_TOKENS, *INFO_TOKENS) if n in special]
    ids = [special[n]["id"] for n in names]
    geo = geometry(model, ids, special)
    tokens = []
    for k, name in enumerate(names):
        token = special[name]["token"]
        count = None if pretrain_counts is None else int(pretrain_counts.get(token, 0))
        row: dict = {
            "name": name,
            "token": token,
            "id": ids[k],
            "template": name in TEMPLATE_TOKENS,
            "pretrain_count": count,
        }
        for matrix, data in geo["matrices"].items():
            for key, values in data["values"].items():
                value = values[k]
                row[f"{matrix}_{key}"] = None if value is None else round(float(value), 4)
        flagged = geo["under_trained"][k]
        row["geometry_under_trained"] = flagged
        if token in added:
            row["verdict"] = "untrained"
            row["basis"] = "added to the vocabulary by hanlm"
        elif count is not None:
            row["verdict"] = "untrained" if count == 0 else "trained"
            row["basis"] = "pretraining count"
        elif flagged is not None:
            row["verdict"] = "untrained" if flagged else "trained"
            row["basis"] = "row geometry"
        else:
            row["verdict"] = "unknown"
            row["basis"] = "no counts and no reference rows"
        tokens.append(row)
    decisions = {m: d["decision"] for m, d in geo["matrices"].items()}
    untrained = [t["name"] for t in tokens if t["template"] and t["verdict"] == "untrained"]
    return {
        "tied": geo["tied"],
        "counts_source": "shard manifest" if pretrain_counts is not None else None,
        "tokens": tokens,
        "decisions": decisions,
        "untrained_template_tokens": untrained,
        "row_norms": row_norms(model, special),
    }


def print_audit(report: dict, title: str = "special-token audit") -> None:
    table = Table(title=f"{title} ({'tied' if report['tied'] else 'untied'} head)")
    columns = ["token", "id", "pretrain count", "emb norm/med", "emb cos mean"]
    if not report["tied"]:
        columns += ["head norm/med", "head cos ref"]
    else:
        columns += ["cos ref"]
    columns.append("verdict")
    for c in columns:
        table.add_column(c, justify="left" if c in ("token", "verdict") else "right")

    def fmt(v):
        return "-" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:.3f}")

    for t in report["tokens"]:
        cells = [t["token"], str(t["id"]), fmt(t["pretrain_count"])]
        cells += [fmt(t.get("embedding_norm_ratio")), fmt(t.get("embedding_cos_mean"))]
        if not report["tied"]:
            cells += [fmt(t.get("head_norm_ratio")), fmt(t.get("head_cos_reference"))]
        else:
            cells += [fmt(t.get("embedding_cos_reference"))]
        colour = "red" if t["verdict"] == "untrained" else "green"
        style = "" if t["template"] else "dim"
        cells.append(f"[{colour}]{t['verdict']}[/{colour}]")
        table.add_row(*cells, style=style)
    console.print(table)


# --- initialisation -------------------------------------------------------------------------------


@torch.no_grad()
def initialise(
    model,
    ids: Sequence[int],
    method: str,
    special: dict,
    *,
    text_ids: Sequence[int] | None = None,
    seed: int = 0,
) -> dict:
    """Set the rows of `ids` in every token matrix by `method`; returns what was done."""
    if method not in INIT_METHODS:
        raise UserError(f"unknown init {method!r}", fix=f"use one of {', '.join(INIT_METHODS)}")
    ids = list(ids)
    if method == "none" or not ids:
        return {"method": method, "ids": ids, "matrices": []}
    if method == "text" and not text_ids:
        raise UserError("init = text needs a text with tokens", fix="set sft.init_text")
    weights = matrices(model)
    all_special = list(special_ids(special).values()) + reference_ids(special)
    ordinary = torch.as_tensor(ordinary_ids(weights["embedding"].shape[0], all_special))
    generator = torch.Generator().manual_seed(seed)
    for weight in weights.values():  # one at a time: a sharded matrix is gathered whole here
        new = _new_rows(_whole_on_cpu(weight), len(ids), method, ordinary, text_ids, generator)
        write_rows(weight, ids, new)
    return {"method": method, "ids": ids, "matrices": list(weights)}


def _new_rows(weight, count: int, method: str, ordinary, text_ids, generator) -> torch.Tensor:
    rows = weight[ordinary].float()
    mean = rows.mean(0)
    if method == "mean":
        return mean.expand(count, -1)
    if method == "mean-cov":
        covariance = torch.cov(rows.T) * COVARIANCE_SCALE
        jitter = 1e-12 * torch.eye(len(covariance))
        lower = torch.linalg.cholesky(covariance + jitter)
        noise = torch.randn(count, len(covariance), generator=generator)
        return mean + noise @ lower.T
    text_index = torch.as_tensor(list(text_ids), dtype=torch.long)
    return weight[text_index].float().mean(0).expand(count, -1)


def _whole_on_cpu(weight: torch.Tensor) -> torch.Tensor:
    """The whole matrix on the CPU, where the rows are computed whatever the device (the same
    arithmetic on every rank and in one process); an FSDP2 matrix is all-gathered."""
    whole = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
    return whole.detach().cpu()


def write_rows(weight: torch.Tensor, ids: Sequence[int], values: torch.Tensor) -> None:
    """weight[ids] = values; a sharded (FSDP2) matrix writes only the rows this rank holds."""
    rows, first = local_block(weight)
    wanted = torch.as_tensor(list(ids), dtype=torch.long)
    mine = (wanted >= first) & (wanted < first + rows.shape[0])
    if mine.any():
        index = (wanted[mine] - first).to(rows.device)
        rows[index] = values[mine].to(rows.device, rows.dtype)


class RowStepScale:
    """Stretch each optimizer step's change to some rows of the token matrices by `scale`."""

    def __init__(self, optimizer: torch.optim.Optimizer, model, ids: Sequence[int], scale: float):
        self.weights = list(matrices(model).values())
        self.ids = list(ids)
        self.scale = scale
        self._before: list[torch.Tensor] = []
        self.handles = [
            optimizer.register_step_pre_hook(self._remember),
            optimizer.register_step_post_hook(self._stretch),
        ]

    def _blocks(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # looked up at each step: FSDP2 may re-point a parameter's local shard (e.g. on load)
        return [local_rows(w, self.ids) for w in self.weights]

    @torch.no_grad()
    def _remember(self, *_):
        self._before = [rows[index].clone() for rows, index in self._blocks()]

    @torch.no_grad()
    def _stretch(self, *_):
        for (rows, index), before in zip(self._blocks(), self._before, strict=True):
            rows[index] = before + self.scale * (rows[index] - before)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def local_rows(weight: torch.Tensor, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows of `weight` this process holds, the positions of `ids` among them).

    A plain tensor holds every row. An FSDP2 parameter is a DTensor sharded on dim 0 the way
    torch.chunk splits it: rank r holds rows [r * ceil(n / ranks), ...) of its local tensor,
    which shares storage with the parameter, so writing it updates the parameter."""
    rows, first = local_block(weight)
    wanted = torch.as_tensor(list(ids), dtype=torch.long)
    mine = wanted[(wanted >= first) & (wanted < first + rows.shape[0])]
    return rows, (mine - first).to(rows.device)


def local_block(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the rows of `weight` this process holds, sharing its storage; the index of the first,
    at most the row count: a rank past the end holds none): see `local_rows`."""
    from torch.distributed.tensor import DTensor, Shard  # deferred: only FSDP runs have them

    if not isinstance(weight, DTensor):
        return weight, 0
    if len(weight.placements) != 1 or weight.placements[0] != Shard(0):
        raise NotImplementedError(
            f"token rows sharded as {weight.placements}: only FSDP2's Shard(0) is supported"
        )
    rows = weight.to_local()
    total_rows, ranks = weight.shape[0], weight.device_mesh.size()
    per_rank = -(-total_rows // ranks)
    first = min(weight.device_mesh.get_local_rank() * per_rank, total_rows)
    if rows.shape[0] != min(per_rank, total_rows - first):
        raise RuntimeError(f"unexpected FSDP2 shard: {rows.shape[0]} rows from row {first}")
    return rows, first
