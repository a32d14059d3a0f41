"""INTERIM (replaced by the helper's version at merge)."""

from __future__ import annotations

import hashlib
import re

import numpy as np

_WS = re.compile(r"\s+")


def signatures(texts, *, num_perm: int, ngram: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**32, size=num_perm, dtype=np.uint64).astype(np.uint32) | np.uint32(1)
    b = rng.integers(0, 2**32, size=num_perm, dtype=np.uint64).astype(np.uint32)
    out = np.empty((len(texts), num_perm), np.uint32)
    for i, t in enumerate(texts):
        c = _WS.sub("", t)
        cps = np.frombuffer(c.encode("utf-32-le"), np.uint32).astype(np.uint32)
        if len(cps) < ngram:
            h = np.array(
                [int.from_bytes(hashlib.blake2b(c.encode(), digest_size=4).digest(), "little")],
                np.uint32,
            )
        else:
            h = np.zeros(len(cps) - ngram + 1, np.uint32)
            for k in range(ngram):
                h = h * np.uint32(0x01000193) ^ cps[k : len(cps) - ngram + 1 + k]
            h ^= h >> np.uint32(16)
            h *= np.uint32(0x85EBCA6B)
            h ^= h >> np.uint32(13)
        out[i] = (h[None, :] * a[:, None] + b[:, None]).min(axis=1)
    return out


def content_hashes(texts) -> np.ndarray:
    return np.frombuffer(
        b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts),
        np.uint32,
    ).reshape(len(texts), 4)
