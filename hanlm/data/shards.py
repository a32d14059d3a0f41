"""`hanlm shards`: the corpus tokenised into NumPy memmap files, in parallel worker processes.

One corpus part is one unit of work and gives `train-NNNNN.bin`, `val-NNNNN.bin` and a sidecar
`part-NNNNN.json` written last, so a killed run resumes by skipping parts whose sidecar exists
and whose token files still have the size and sha256 it records (others are encoded again).
Work happens in `shards.incomplete/`; the finished folder is renamed to `shards/` with its
`manifest.json`. Documents are separated by the end-of-document token; the train/val split is
decided per document by a seeded hash of its id, so it does not depend on the number of workers.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from hanlm.chat_template import SPECIAL_TOKENS_FILE
from hanlm.config import ShardsSection
from hanlm.console import info, progress, warn
from hanlm.data.corpus import corpus_parts, iter_part
from hanlm.data.loader import MANIFEST_NAME
from hanlm.data.tokenizer import END_OF_DOCUMENT
from hanlm.errors import UserError
from hanlm.files import (
    atomic_write_bytes,
    atomic_write_json,
    file_mismatch,
    read_json,
)

STAGE = "shards"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
WORK_MARKER = "work.json"
MANIFEST_FILE = MANIFEST_NAME  # the loader reads what this stage writes


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def is_val(doc_id: str, seed: int, val_fraction: float) -> bool:
    """A seeded, order-free coin per document: the split never depends on who encodes it."""
    digest = hashlib.blake2b(f"{seed}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < val_fraction


# ---------------------------------------------------------------------------------------------
# Worker side: imports only numpy and tokenizers, never torch.

_worker_tokenizer = None


def _init_worker(tokenizer_path: str) -> None:
    # One thread per worker: N workers use N cores, and rayon must not start after a fork.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.from_file(tokenizer_path)


def _batches(part: Path, size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for doc in iter_part(part):
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_part(job: dict) -> dict:
    """Tokenise one corpus part into its train and val files; returns the sidecar it wrote."""
    tok = _worker_tokenizer
    eod, dtype = job["eod_id"], np.dtype(job["dtype"])
    pieces: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    counts = {s: {"tokens": 0, "documents": 0, "bytes": 0} for s in SPLITS}
    first = job["index"] == 0
    for batch in _batches(Path(job["part"]), job["batch_docs"]):
        encodings = tok.encode_batch_fast([d["text"] for d in batch])
        for doc, enc in zip(batch, encodings, strict=True):
            val = job["val_fraction"] > 0 and (
                first or is_val(doc["id"], job["seed"], job["val_fraction"])
            )
            first = False  # the first document of part 0 always goes to val: val is never empty
            split = "val" if val else "train"
            ids = enc.ids
            ids.append(eod)
            pieces[split].append(np.array(ids, dtype=dtype))
            c = counts[split]
            c["tokens"] += len(ids)
            c["documents"] += 1
            c["bytes"] += len(doc["text"].encode("utf-8"))
    out_dir = Path(job["out_dir"])
    special_ids = np.asarray(job["special_ids"], dtype=np.int64)
    sidecar: dict = {"part": Path(job["part"]).name, "tokenizer_sha256": job["tokenizer_sha256"]}
    for split in SPLITS:
        tokens = np.concatenate(pieces[split]) if pieces[split] else np.zeros(0, dtype=dtype)
        name = f"{split}-{job['index']:05d}.bin"
        data = tokens.tobytes()
        atomic_write_bytes(out_dir / name, data)
        # size and checksum: a resumed run reuses the file only if it still matches them
        record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        sidecar[split] = {"path": name, **counts[split], **record}
        if split == "train":
            hist = np.bincount(tokens, minlength=int(special_ids.max()) + 1)
            sidecar["special_token_counts"] = hist[special_ids].tolist()
    atomic_write_json(out_dir / f"part-{job['index']:05d}.json", sidecar)
    return sidecar


# ---------------------------------------------------------------------------------------------
# Coordinator side


def _special_tokens(tokenizer_dir: Path) -> dict[str, int]:
    spec = read_json(tokenizer_dir / SPECIAL_TOKENS_FILE)
    names = {v["token"]: v["id"] for k, v in spec.items() if isinstance(v, dict) and "id" in v}
    names.update({r["token"]: r["id"] for r in spec["reserved"]})
    return dict(sorted(names.items(), key=lambda kv: kv[1]))


def _reusable_part(work: Path, index: int, sha: str) -> dict | None:
    """The sidecar of a part encoded by an interrupted run, or None when the part must be
    encoded again: no sidecar, another tokenizer, or a token file whose size or checksum
    differs from what was written."""
    path = work / f"part-{index:05d}.json"
    if not path.is_file():
        return None
    try:
        sidecar = read_json(path)
        entries = [sidecar[s] for s in SPLITS]
        problems = [
            file_mismatch(work / e["path"], e) if "sha256" in e else f"{e['path']} has no checksum"
            for e in entries
        ]
        if sidecar["tokenizer_sha256"] != sha:
            problems.append(f"{path.name} names another tokenizer")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        problems = [f"{path.name} cannot be read"]
    problems = [p for p in problems if p]
    if problems:
        warn(f"shards: part {index} is encoded again: {'; '.join(problems)}")
        return None
    return sidecar


def made_with_tokenizer(shards_dir: Path) -> str | None:
    """The sha256 of the tokenizer a shards folder's manifest says it was made with (None when
    the folder has no manifest)."""
    manifest = shards_dir / MANIFEST_FILE
    if not manifest.is_file():
        return None
    return str(read_json(manifest).get("tokenizer_sha256"))


def damaged_outputs(out: Path) -> list[str]:
    """What is wrong with the token files of a finished shards folder (sizes only: see
    file_mismatch), or an empty list."""
    try:
        manifest = read_json(out / MANIFEST_FILE)
        dtype = np.dtype(manifest["dtype"])
        entries = [f for split in SPLITS for f in manifest["splits"][split]["files"]]
        return [
            problem
            for e in entries
            if (problem := file_mismatch(out / e["path"], {"size": e["tokens"] * dtype.itemsize}))
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return ["manifest.json cannot be read"]


def _work_fingerprint(marker: Path) -> str | None:
    try:
        return read_json(marker).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def _prepare_workdir(work: Path, fp: str) -> None:
    marker = work / WORK_MARKER
    if work.is_dir() and _work_fingerprint(marker) != fp:
        shutil.rmtree(work)  # leftovers of a different configuration (or an unreadable marker)
    work.mkdir(parents=True, exist_ok=True)
    if not marker.is_file():
        atomic_write_json(marker, {"fingerprint": fp})


def _manifest(
    sidecars: list[dict], vocab_size: int, dtype: np.dtype, sha: str, special: dict
) -> dict:
    splits = {}
    for split in SPLITS:
        files = [s[split] for s in sidecars if s[split]["tokens"] > 0]
        splits[split] = {
            "files": files,
            **{k: sum(f[k] for f in files) for k in ("tokens", "documents", "bytes")},
        }
    totals = np.sum([s["special_token_counts"] for s in sidecars], axis=0)
    return {
        "format": FORMAT_VERSION,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "tokenizer_sha256": sha,
        "eod_id": special[END_OF_DOCUMENT],
        "splits": splits,
        "special_token_counts": {t: int(n) for t, n in zip(special, totals, strict=True)},
    }


def encode_corpus(
    corpus_dir: Path,
    tokenizer_json: Path,
    sha: str,
    s: ShardsSection,
    seed: int,
    work: Path,
    fp: str,
) -> dict:
    """Encode every part of a corpus folder into `work` (keeping the parts an interrupted run of
    the same fingerprint finished) and write its manifest.json; the manifest."""
    tokenizer_dir = tokenizer_json.parent
    parts = corpus_parts(corpus_dir)
    special = _special_tokens(tokenizer_dir)
    vocab_size = read_json(tokenizer_dir / SPECIAL_TOKENS_FILE)["vocab_size"]
    dtype = token_dtype(vocab_size)
    _prepare_workdir(work, fp)
    jobs = [
        {
            "part": str(p),
            "index": i,
            "out_dir": str(work),
            "eod_id": special[END_OF_DOCUMENT],
            "dtype": dtype.name,
            "val_fraction": s.val_fraction,
            "seed": seed,
            "batch_docs": s.batch_docs,
            "special_ids": list(special.values()),
            "tokenizer_sha256": sha,
        }
        for i, p in enumerate(parts)
    ]
    done = {i: sc for i in range(len(jobs)) if (sc := _reusable_part(work, i, sha)) is not None}
    todo = [j for j in jobs if j["index"] not in done]
    workers = max(1, min(s.workers or os.cpu_count() or 1, len(todo) or 1))
    started = time.perf_counter()
    if done:
        info(f"shards: resuming, {len(done)} of {len(jobs)} parts already encoded")
    with progress() as bar:
        task = bar.add_task(f"shards ({workers} workers)", total=len(jobs), completed=len(done))
        for sidecar in _encode(todo, workers, tokenizer_json):
            done[int(sidecar["train"]["path"].split("-")[1].split(".")[0])] = sidecar
            bar.advance(task)
    sidecars = [done[i] for i in range(len(jobs))]
    manifest = _manifest(sidecars, vocab_size, dtype, sha, special)
    if manifest["splits"]["train"]["tokens"] == 0:
        raise UserError(f"no training tokens from {corpus_dir}", fix="give the corpus more text")
    manifest["seconds"] = round(time.perf_counter() - started, 3)
    manifest["workers"] = workers
    atomic_write_json(work / MANIFEST_FILE, manifest)
    return manifest


def _encode(jobs: list[dict], workers: int, tokenizer_path: Path) -> Iterator[dict]:
    if not jobs:
        return
    if workers == 1:
        saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
        _init_worker(str(tokenizer_path))
        try:
            for job in jobs:
                yield encode_part(job)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return
    # spawn, not fork: the parent may hold rayon threads from an earlier tokenizers call.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_path),)) as pool:
        yield from pool.imap_unordered(encode_part, jobs)
