"""The checkpoint folder's disk: write throughput with fsync, fsync latency, read-back, free space.

The test writes into a temporary folder inside the checkpoint folder (or, when that does not exist
yet, its nearest existing parent: the same file system it will be created on) and removes it.
Test hooks: HANLM_FAULT_SLOW_DISK_S sleeps that long on every write (a slow or overloaded disk)
and HANLM_FAULT_FREE_BYTES replaces the free space the file system reports (a full disk).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

CHUNK_BYTES = 4 << 20  # checkpoint writers stream in blocks of a few MB
PROBE_BYTES = 4096


def _slow_disk_delay() -> None:
    delay = float(os.environ.get("HANLM_FAULT_SLOW_DISK_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)


def free_bytes(folder: Path) -> int:
    override = os.environ.get("HANLM_FAULT_FREE_BYTES")
    if override:
        return int(float(override))
    return shutil.disk_usage(folder).free


def existing_parent(folder: Path) -> Path:
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _chunk(template: np.ndarray, index: int) -> bytes:
    """A distinct 4 MB block per index, so a misplaced or stale block fails the read-back."""
    block = template.copy()
    block[:8] = np.frombuffer(index.to_bytes(8, "little"), dtype=np.uint8)
    return block.tobytes()


def _write_and_read_back(folder: Path, size_bytes: int) -> dict:
    chunks = max(1, -(-size_bytes // CHUNK_BYTES))
    template = np.random.default_rng(0).integers(0, 256, CHUNK_BYTES, dtype=np.uint8)
    blocks = [_chunk(template, i) for i in range(min(chunks, 8))]  # reused cyclically
    path = folder / "throughput.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(chunks):
            _slow_disk_delay()
            f.write(blocks[i % len(blocks)])
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    written = chunks * CHUNK_BYTES

    fd = os.open(path, os.O_RDONLY)
    try:  # ask the kernel to forget the cached pages, so the read-back reads the disk
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        pass
    finally:
        os.close(fd)
    start = time.perf_counter()
    mismatches = 0
    with open(path, "rb") as f:
        for i in range(chunks):
            if f.read(CHUNK_BYTES) != blocks[i % len(blocks)]:
                mismatches += 1
    read_s = time.perf_counter() - start
    return {
        "bytes_written": written,
        "write_mb_s": written / write_s / 1e6,
        "read_mb_s": written / max(read_s, 1e-9) / 1e6,
        "read_back_ok": mismatches == 0,
        "read_back_bad_blocks": mismatches,
    }


def _fsync_latency(folder: Path, probes: int) -> dict:
    times = []
    payload = b"\0" * PROBE_BYTES
    with open(folder / "fsync.bin", "wb") as f:
        for _ in range(probes):
            start = time.perf_counter()
            _slow_disk_delay()
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - start)
    return {
        "fsync_ms_median": statistics.median(times) * 1000,
        "fsync_ms_max": max(times) * 1000,
    }


def measure(folder: Path, *, size_mb: float, probes: int) -> dict:
    folder = Path(folder)
    probe_dir = existing_parent(folder)
    result: dict = {
        "folder": str(folder),
        "probe_dir": str(probe_dir),
        "exists": folder.is_dir(),
    }
    try:
        result["free_bytes"] = free_bytes(probe_dir)
    except OSError as e:
        result["free_bytes"] = None
        result["error"] = f"cannot read the free space: {e}"
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".hanlm-preflight-", dir=probe_dir))
    except OSError as e:
        result.update(writable=False, error=f"{type(e).__name__}: {e.strerror or e}")
        return result
    result["writable"] = True
    try:
        result.update(_write_and_read_back(scratch, int(size_mb * 1e6)))
        result.update(_fsync_latency(scratch, probes))
    except OSError as e:  # no space, I/O error, quota, permission on files only
        result["error"] = f"{type(e).__name__}: {e.strerror or e}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result
