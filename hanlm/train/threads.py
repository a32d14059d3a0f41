"""The CPU threads a process computes with: one fixed count, whatever the machine's load.

Some of torch's CPU kernels split a sum among the threads of a parallel region (LayerNorm's
weight gradient, for one), so the last bits of their results depend on how many threads ran
it, and training carries those bits into every later step. torch settles its thread count once,
at start: OMP_NUM_THREADS (or MKL_NUM_THREADS), else the CPU cores this process may run on. But
with OpenMP's dynamic adjustment on (OMP_DYNAMIC=true; the GNU runtime torch ships then sizes
each parallel region by the machine's load average), a region gets fewer threads than
`torch.get_num_threads()` says whenever the machine is busy, so two runs of the same config on
the same machine trained different weights depending on the load.

`pin()` turns the adjustment off for the calling thread (the training loop's: every float
kernel of a CPU training step runs there; the batch reader and the checkpoint writer only count
integers and copy) and sets torch's count explicitly, to the count torch chose, so that threads
started later use it too. What a run computes then depends on the config, the seed, the machine
(CPU, torch and its libraries) and that count, never on the load; the count is one setting the
user controls (OMP_NUM_THREADS), and pretraining logs it.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import torch

# OpenMP runtimes as a process maps them: GNU (libgomp), LLVM (libomp), Intel (libiomp5)
_OPENMP_LIBRARY = re.compile(r"/lib(gomp|omp|iomp5)[-.][^/]*$")


def _openmp_runtimes() -> list[ctypes.CDLL]:
    """The OpenMP runtimes loaded in this process (torch's among them), or the process's own
    symbols where the loaded libraries cannot be listed."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: look the functions up among the loaded symbols
        maps = None
    if maps is None:
        try:
            return [ctypes.CDLL(None)]
        except (OSError, TypeError):  # Windows: no handle for the process's own symbols
            return []
    fields = (line.split(None, 5) for line in maps.splitlines())
    paths = {f[5].strip() for f in fields if len(f) == 6}  # the mapped file, where there is one
    runtimes = []
    for path in sorted(p for p in paths if _OPENMP_LIBRARY.search(p)):
        try:
            runtimes.append(ctypes.CDLL(path))  # already loaded: the same library, not a copy
        except OSError:
            continue
    return runtimes


def dynamic_adjustment() -> bool:
    """Whether an OpenMP runtime of this process may give the calling thread's parallel
    regions fewer threads than asked (OMP_DYNAMIC)."""
    for runtime in _openmp_runtimes():
        try:
            if runtime.omp_get_dynamic():
                return True
        except AttributeError:
            continue
    return False


def pin() -> int:
    """Fix the calling thread's CPU thread count (see the module docstring); returns it."""
    for runtime in _openmp_runtimes():
        try:
            runtime.omp_set_dynamic(0)
        except AttributeError:  # no OpenMP there: nothing adjusts the count
            continue
    count = torch.get_num_threads()
    torch.set_num_threads(count)
    return count
