"""Where the documents of a packed row start, as per-document position ids.

A row packs several documents one after another: SFT places whole conversations in a row, and a
pretraining window cuts through documents that end with the end-of-document token. For the
documents not to see each other, each token's position restarts at 0 where its document starts;
the model's attention is then kept within a document (hanlm.train.document_attention turns the
positions into an attention mask) and its rotary positions are those the document would have
alone. A pretraining window that starts inside a document counts that piece from 0 too.

The loaders hand the positions to the model as the batch's extra model inputs,
`{"position_ids": ...}`, and only for a batch in which some row holds more than one document:
a row of one document is plain causal attention, so such a batch stays exactly as it was.

NumPy only: the data package imports without torch.
"""

from __future__ import annotations

import numpy as np


def positions_from_starts(starts: np.ndarray) -> np.ndarray:
    """int64 positions of rows `(rows, length)`, counting from 0 at each True of `starts` (and
    at each row's first token)."""
    starts = np.asarray(starts, dtype=bool)
    columns = np.arange(starts.shape[1], dtype=np.int64)
    start_columns = np.where(starts, columns, 0)  # column 0 always starts a piece
    return columns - np.maximum.accumulate(start_columns, axis=1)


def positions_after_separator(tokens: np.ndarray, separator: int) -> np.ndarray:
    """Positions of token rows whose documents end with `separator`: the token after one starts
    the next document (the separator itself is the last token of its document)."""
    tokens = np.asarray(tokens)
    starts = np.zeros(tokens.shape, dtype=bool)
    starts[:, 1:] = tokens[:, :-1] == separator
    return positions_from_starts(starts)


def extra_model_inputs(positions: np.ndarray) -> dict[str, np.ndarray]:
    """The model inputs that keep the documents of rows apart: `{"position_ids": positions}`,
    or nothing when every row holds one document (plain causal attention is then exact)."""
    if not (positions[:, 1:] == 0).any():
        return {}
    return {"position_ids": np.ascontiguousarray(positions, dtype=np.int64)}
