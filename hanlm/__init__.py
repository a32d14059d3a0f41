"""hanlm: from raw Korean text to an honestly evaluated small chat model.

Kept import-light on purpose: shard workers import `hanlm.data.*` and must not pay for torch.
"""

from hanlm import import_noise

__version__ = "0.1.0"

import_noise.install()  # before anything imports torchao: its CUDA-less import noise is dropped
