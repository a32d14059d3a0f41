"""hanlm: from raw Korean text to an honestly evaluated small chat model.

Kept import-light on purpose: shard workers import `hanlm.data.*` and must not pay for torch.
"""

__version__ = "0.1.0"
