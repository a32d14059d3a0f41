"""Fixed-length training sequences from token shards, in a resumable global order.

Samples. A sample is a window of `seq_len + 1` tokens: the inputs are its first `seq_len` tokens
and the labels its last `seq_len` (the same tokens shifted by one). Windows never cross a file
boundary: a file of `T` tokens holds `(T - 1) // seq_len` samples, sample `k` starting at token
`k * seq_len`, so consecutive samples share one token and a file's tail shorter than a window is
never read. Samples are numbered globally, file after file, in the order the files are given.

Global order. For epoch `e` the samples are visited in one permutation drawn from
`np.random.default_rng([seed, epoch])` (or in file order when `shuffle` is off). With a mixture
of corpus sources (hanlm.data.mixture), an epoch is instead the training budget's windows drawn
from each source, in the mixture's interleaved, seeded order. Every rank computes the same
order, so no communication is needed.

Steps. Each call to `next_batch()` on every rank consumes one *global step* of
`micro_batch * world_size` positions of that order; rank `r` takes positions
`[consumed + r * micro_batch, consumed + (r + 1) * micro_batch)`. Hence one rank with
micro_batch 4 sees exactly the samples that two ranks with micro_batch 2 see together: rank 0
the first two and rank 1 the last two of every group of four. When fewer than one step's worth
of positions is left in an epoch, the remainder is dropped (so all ranks stay in lockstep) and
the next epoch starts.

Documents. With `end_of_document` set (pretrain.document_masking), a window's documents do not
see each other: a batch in which some window holds more than one document carries per-document
position ids, `(inputs, labels, {"position_ids": ...})` (hanlm.data.packing); every other batch
is `(inputs, labels)`, as without it. The order and the state are the same either way.

State. `state_dict()` is global and identical on every rank: the epoch and how many positions
of its order all ranks together have consumed. Loading it with another world_size or
micro_batch is allowed and continues the order exactly at `consumed`, with no sample skipped
or repeated; only the end-of-epoch drop is then decided with the new step size.

torch is imported lazily: shard workers import `hanlm.data.*` and must not pay for it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hanlm.data import packing
from hanlm.data.manifest import (
    MANIFEST_NAME,
    REBUILD_SHARDS,
    check_tokenizer,
    end_of_document_id,
    parse_dtype,
    read_manifest,
    split_files,
)
from hanlm.data.mixture import Mixture
from hanlm.errors import UserError

if TYPE_CHECKING:
    import torch

# (inputs, labels), or (inputs, labels, extra model inputs) for rows of packed documents
Batch = tuple["torch.Tensor", ...]

STATE_VERSION = 1
STATE_KEYS = ("version", "fingerprint", "seed", "epoch", "consumed")


def position_state(version: int, fingerprint: str, seed: int, epoch: int, consumed: int) -> dict:
    """A loader's saved state: where in which data (its fingerprint) and order (its seed) it is;
    the token and chat loaders save the same fields."""
    return {
        "version": version,
        "fingerprint": fingerprint,
        "seed": seed,
        "epoch": epoch,
        "consumed": consumed,
    }


class TokenLoader:
    """Batches of `(inputs, labels)` int64 tensors of shape `(micro_batch, seq_len)` for one rank.

    rank and world_size are passed in (the trainer reads them from torch.distributed), which
    keeps this class usable and testable without a process group.
    """

    def __init__(
        self,
        files: Sequence[Path],
        *,
        dtype: str | np.dtype,
        seq_len: int,
        micro_batch: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        pin_memory: bool = False,
        end_of_document: int | None = None,
        file_sources: Sequence[str] | None = None,
        mixture: Mixture | None = None,
    ):
        _check_at_least("seq_len", seq_len, 1)
        _check_at_least("micro_batch", micro_batch, 1)
        _check_at_least("world_size", world_size, 1)
        _check_at_least("seed", seed, 0)
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise UserError(
                f"rank {rank!r} is out of range for world_size {world_size}",
                fix=f"pass a rank between 0 and {world_size - 1}",
            )
        if not files:
            raise UserError("no token files were given to the data loader")

        self.dtype = parse_dtype(dtype)
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = bool(shuffle)
        self.pin_memory = pin_memory
        self.end_of_document = end_of_document  # None: windows are not split into documents

        self._paths = [Path(f) for f in files]
        self._tokens = [_open_tokens(path, self.dtype) for path in self._paths]
        token_counts = np.array([len(t) for t in self._tokens], dtype=np.int64)
        samples = np.maximum(token_counts - 1, 0) // seq_len
        self._file_ends = np.cumsum(samples)
        self._file_starts = self._file_ends - samples
        self._window_offsets = np.arange(seq_len + 1, dtype=np.int64)
        self.total_tokens = int(token_counts.sum())
        self.mixture = mixture
        self.file_sources = list(file_sources) if file_sources is not None else None
        self.source_names = list(dict.fromkeys(self.file_sources or []))
        self._file_source_index = np.array(
            [self.source_names.index(n) for n in self.file_sources or []], dtype=np.int64
        )
        self._source_ids: list[np.ndarray] = []
        self._epoch_samples = int(self._file_ends[-1])
        if mixture is not None:
            self._source_ids = self._windows_by_source(mixture, file_sources)
            self._epoch_samples = mixture.total
        self.fingerprint = _fingerprint(
            self._paths, token_counts, self.dtype, seq_len, self.shuffle,
            [[s.name, s.drawn] for s in mixture.sources] if mixture is not None else None,
        )  # fmt: skip
        self._check_enough_samples()

        self._epoch = 0
        self._consumed = 0
        self._cached_order: tuple[int, np.ndarray] | None = None

    @classmethod
    def from_shards(
        cls,
        shards_dir: Path,
        split: str = "train",
        *,
        seq_len: int,
        micro_batch: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool | None = None,
        expected_tokenizer_sha256: str | None = None,
        pin_memory: bool = False,
        document_masking: bool = False,
        mixture: Mixture | None = None,
    ) -> TokenLoader:
        """A loader over one split of a shards folder, after checking it against its manifest.

        shuffle defaults to True for "train" and False for every other split. With
        document_masking, the manifest's end-of-document id splits windows into documents.
        With a mixture (hanlm.data.mixture.plan over hanlm.data.manifest.source_windows), an
        epoch is its budget of windows drawn from each source.
        """
        shards_dir = Path(shards_dir)
        manifest = read_manifest(shards_dir)
        if expected_tokenizer_sha256 is not None:
            check_tokenizer(manifest, expected_tokenizer_sha256, shards_dir)
        dtype = parse_dtype(manifest.get("dtype"), where=str(shards_dir / MANIFEST_NAME))
        files, sources = split_files(manifest, split, shards_dir, dtype)
        return cls(
            files,
            dtype=dtype,
            seq_len=seq_len,
            micro_batch=micro_batch,
            rank=rank,
            world_size=world_size,
            seed=seed,
            shuffle=(split == "train") if shuffle is None else shuffle,
            pin_memory=pin_memory,
            end_of_document=end_of_document_id(manifest, shards_dir) if document_masking else None,
            file_sources=sources,
            mixture=mixture,
        )

    # ---- sizes -------------------------------------------------------------------------------

    def _windows_by_source(
        self, mixture: Mixture, file_sources: Sequence[str] | None
    ) -> list[np.ndarray]:
        """Each mixed source's sample ids, in file order; they must be the windows the mixture
        was planned with."""
        if file_sources is None or len(file_sources) != len(self._paths):
            raise ValueError("a mixture needs the corpus source of every token file")
        ids = []
        for share in mixture.sources:
            files = [i for i, name in enumerate(file_sources) if name == share.name]
            ranges = [np.arange(self._file_starts[i], self._file_ends[i]) for i in files]
            ids.append(np.concatenate(ranges) if ranges else np.zeros(0, np.int64))
            if len(ids[-1]) != share.windows:
                raise ValueError(
                    f"source {share.name!r} has {len(ids[-1])} windows, the mixture was planned "
                    f"with {share.windows}"
                )
        return ids

    @property
    def samples_per_epoch(self) -> int:
        """Samples in one pass (the whole data, or a mixture's budget), before the end-of-epoch
        remainder is dropped."""
        return self._epoch_samples

    @property
    def samples_per_step(self) -> int:
        """Samples one global step consumes, all ranks together."""
        return self.micro_batch * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        return self.samples_per_epoch // self.samples_per_step

    @property
    def tokens_per_step(self) -> int:
        """Input tokens one global step trains on, all ranks together."""
        return self.samples_per_step * self.seq_len

    @property
    def epoch(self) -> int:
        """Epoch of the most recently consumed step (0 before the first)."""
        return self._epoch

    # ---- training stream ---------------------------------------------------------------------

    def next_batch(self) -> Batch:
        """This rank's part of the next global step; every rank must call it once per step."""
        return self._to_batch(self._read_windows(self._take_step()))

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def _take_step(self) -> np.ndarray:
        """Sample ids of this rank's slice of the next global step, advancing the global state."""
        # The drop decision is taken here rather than after the last full step, so that a
        # resume with a smaller step size can still use the tail of the epoch.
        if self._consumed + self.samples_per_step > self.samples_per_epoch:
            self._epoch += 1
            self._consumed = 0
        start = self._consumed + self.rank * self.micro_batch
        ids = self._order_slice(self._epoch, start, start + self.micro_batch)
        self._consumed += self.samples_per_step
        return ids

    def _order_slice(self, epoch: int, start: int, stop: int) -> np.ndarray:
        if not self.shuffle and self.mixture is None:
            return np.arange(start, stop, dtype=np.int64)
        return self._epoch_order(epoch)[start:stop]

    def _epoch_order(self, epoch: int) -> np.ndarray:
        # Drawing a permutation costs O(samples), so it is done once per epoch, not per step.
        if self._cached_order is None or self._cached_order[0] != epoch:
            if self.mixture is not None:
                order = self.mixture.order(self._source_ids, self.seed, epoch, self.shuffle)
            else:
                order = np.random.default_rng([self.seed, epoch]).permutation(self._epoch_samples)
            self._cached_order = (epoch, order)
        return self._cached_order[1]

    def sample_sources(self, sample_ids: np.ndarray) -> np.ndarray:
        """The index (into source_names) of each sample's source; 0 without sources."""
        if not len(self._file_source_index):
            return np.zeros(len(sample_ids), dtype=np.int64)
        file_ids = np.searchsorted(self._file_ends, sample_ids, side="right")
        return self._file_source_index[file_ids]

    # ---- reading -----------------------------------------------------------------------------

    def _read_windows(self, sample_ids: np.ndarray) -> np.ndarray:
        """Token windows `(len(sample_ids), seq_len + 1)`, gathered with one index per file."""
        file_ids = np.searchsorted(self._file_ends, sample_ids, side="right")
        first_tokens = (sample_ids - self._file_starts[file_ids]) * self.seq_len
        windows = np.empty((len(sample_ids), self.seq_len + 1), dtype=self.dtype)
        for file_id in np.unique(file_ids):
            rows = np.flatnonzero(file_ids == file_id)
            token_index = first_tokens[rows, None] + self._window_offsets
            windows[rows] = self._tokens[file_id][token_index]
        return windows

    def _to_batch(self, windows: np.ndarray) -> Batch:
        import torch  # deferred: the data package imports without torch (preflight, shards)

        tensors = [
            torch.from_numpy(np.ascontiguousarray(windows[:, :-1], dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(windows[:, 1:], dtype=np.int64)),
        ]
        extra = {}
        if self.end_of_document is not None:
            positions = packing.positions_after_separator(windows[:, :-1], self.end_of_document)
            extra = {
                k: torch.from_numpy(v) for k, v in packing.extra_model_inputs(positions).items()
            }
        if self.pin_memory and torch.cuda.is_available():
            tensors = [t.pin_memory() for t in tensors]
            extra = {k: v.pin_memory() for k, v in extra.items()}
        return (*tensors, extra) if extra else tuple(tensors)

    # ---- evaluation --------------------------------------------------------------------------

    def eval_batches(self, max_batches: int | None = None) -> Iterator[Batch]:
        """One fresh pass in file order, sliced by rank like training; training state untouched.

        Every rank yields the same number of batches (the remainder that does not fill a whole
        step is left out), so collectives per batch cannot hang.
        """
        for _, batch in self.eval_batches_with_sources(max_batches):
            yield batch

    def eval_batches_with_sources(
        self, max_batches: int | None = None
    ) -> Iterator[tuple[np.ndarray, Batch]]:
        """eval_batches, each with the source index (into source_names) of each of its rows.
        The sources' windows are spread evenly through the pass (the order of a mixture of
        equal windows), so the first batches already hold every source."""
        steps = int(self._file_ends[-1]) // self.samples_per_step
        if max_batches is not None:
            _check_at_least("max_batches", max_batches, 0)
            steps = min(steps, max_batches)
        order = self._spread_order()
        for step in range(steps):
            start = step * self.samples_per_step + self.rank * self.micro_batch
            ids = order[start : start + self.micro_batch]
            yield self.sample_sources(ids), self._to_batch(self._read_windows(ids))

    def _spread_order(self) -> np.ndarray:
        samples = int(self._file_ends[-1])
        if len(self.source_names) < 2:
            return np.arange(samples, dtype=np.int64)
        source = self.sample_sources(np.arange(samples))
        times = np.empty(samples)
        for index in range(len(self.source_names)):
            rows = np.flatnonzero(source == index)
            times[rows] = (np.arange(len(rows)) + 0.5) / len(rows)
        return np.argsort(times, kind="stable")

    # ---- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Global position in the stream; the same on every rank, so saving rank 0's suffices."""
        return position_state(
            STATE_VERSION, self.fingerprint, self.seed, self._epoch, self._consumed
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the saved global position.

        world_size and micro_batch may differ from the saving run: the order continues at
        `consumed` with no sample skipped or repeated, and the end-of-epoch drop is decided with
        the new step size.
        """
        where = "the data-loader state in the checkpoint"
        _check_state_shape(state, where)
        if state["fingerprint"] != self.fingerprint:
            raise UserError(
                "the token data or seq_len changed since the checkpoint was saved "
                f"(data fingerprint {state['fingerprint']!r} then, {self.fingerprint!r} now)",
                where=where,
                fix="resume with the same shards and seq_len as that run, "
                "or start a new run instead of resuming",
            )
        if state["seed"] != self.seed:
            raise UserError(
                f"the checkpoint was saved with data seed {state['seed']}, this run uses {self.seed}",
                where=where,
                fix=f"set run.seed = {state['seed']} to resume, or start a new run instead",
            )
        if state["consumed"] > self.samples_per_epoch:
            raise UserError(
                f"the state says {state['consumed']} samples of the epoch were consumed, "
                f"but an epoch has only {self.samples_per_epoch}",
                where=where,
                fix="resume from an intact checkpoint of this run",
            )
        self._epoch = int(state["epoch"])
        self._consumed = int(state["consumed"])

    def _check_enough_samples(self) -> None:
        if self.samples_per_epoch >= self.samples_per_step:
            return
        raise UserError(
            f"the data has {self.total_tokens:,} tokens in {len(self._paths)} file(s), which make "
            f"{self.samples_per_epoch} samples of seq_len + 1 = {self.seq_len + 1} tokens, but one "
            f"step needs micro_batch × world_size = {self.samples_per_step} samples "
            f"(about {self.samples_per_step * self.seq_len:,} tokens)",
            where=str(self._paths[0].parent),
            fix="use a smaller seq_len or micro_batch, or add more data",
        )


# ---- helpers ---------------------------------------------------------------------------------


def _check_at_least(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(
            f"{name} must be an integer ≥ {minimum}, got {value!r}",
            fix=f"set {name} to {max(minimum, 1)} or more",
        )


def _open_tokens(path: Path, dtype: np.dtype) -> np.ndarray:
    if not path.is_file():
        raise UserError("token file not found", where=str(path), fix=REBUILD_SHARDS)
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise UserError(
            f"token file has {size} bytes, not a whole number of {dtype.name} tokens",
            where=str(path),
            fix=REBUILD_SHARDS,
        )
    if size == 0:  # mmap refuses empty files; an empty file simply holds no samples
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _fingerprint(
    paths: Sequence[Path], token_counts: np.ndarray, dtype: np.dtype, seq_len: int,
    shuffle: bool, mixture: list | None,
) -> str:  # fmt: skip
    # File names, not full paths: moving the shards folder must not break a resume.
    described = {
        "files": [[p.name, int(n)] for p, n in zip(paths, token_counts, strict=True)],
        "dtype": dtype.name,
        "seq_len": seq_len,
        "shuffle": shuffle,
    }
    if mixture is not None:  # windows drawn per source: another mix is another order
        described["mixture"] = mixture
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _check_state_shape(state: Any, where: str) -> None:
    fix = "resume from an intact checkpoint of this run, or start a new run"
    if not isinstance(state, Mapping):
        raise UserError(f"expected a mapping, got {type(state).__name__}", where=where, fix=fix)
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise UserError(f"the state lacks the keys {missing}", where=where, fix=fix)
    if state["version"] != STATE_VERSION:
        raise UserError(
            f"unknown data-loader state version {state['version']!r}", where=where, fix=fix
        )
    if not isinstance(state["fingerprint"], str):
        raise UserError("the state's fingerprint is not a string", where=where, fix=fix)
    for key in ("seed", "epoch", "consumed"):
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise UserError(
                f"the state's {key} must be an integer ≥ 0, got {value!r}", where=where, fix=fix
            )
