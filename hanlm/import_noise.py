"""Log lines other libraries print while being imported that look like failures but are not.

Importing torchao (transformers does so whenever it is installed) on a machine without CUDA logs
"Failed to load …/torchao/_C_mxfp8….so" and "…/_C_cutlass_90a….so": those extensions hold CUDA
kernels hanlm never calls (FP8 matmuls go through torch._scaled_mm, or its CPU emulation). torch
also logs a deprecation for each of torchao's enums registered with pytree. A newcomer reads all
of them as errors. Exactly these records are dropped, by logging filters installed at
`import hanlm`; every other message of those loggers still shows.
"""

from __future__ import annotations

import logging
import re
import sys

TORCHAO_LOGGER = "torchao"
PYTREE_LOGGER = "torch.utils._pytree"
# torchao/__init__.py: logger.warning(f"Failed to load {file}: {e}") for each torchao/_C*.so
EXTENSION_FAILURE = re.compile(r"Failed to load \S*torchao[/\\]_C[^/\\]*\.so: ")


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")  # torchao imports torch before it logs
    return torch is not None and torch.cuda.is_available()


class TorchaoExtensionFailureFilter(logging.Filter):
    """Drops torchao's failures to load its compiled extensions where there is no CUDA for them
    (with CUDA, a failure means a build mismatch worth seeing)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not EXTENSION_FAILURE.match(record.getMessage()):
            return True
        return _cuda_available()


class TorchaoEnumDeprecationFilter(logging.Filter):
    """Drops torch's "is an Enum subclass … register_constant() … deprecated" for torchao's enums."""

    def filter(self, record: logging.LogRecord) -> bool:
        registered = record.args[0] if isinstance(record.args, tuple) and record.args else None
        from_torchao = isinstance(registered, type) and registered.__module__.startswith("torchao")
        return not (from_torchao and "register_constant()" in str(record.msg))


def install() -> None:
    """Attach the filters (once) to the loggers that print these lines."""
    for name, kind in (
        (TORCHAO_LOGGER, TorchaoExtensionFailureFilter),
        (PYTREE_LOGGER, TorchaoEnumDeprecationFilter),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
