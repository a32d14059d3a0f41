"""The built-in synthetic Korean world of the demo pipeline (see `world.py`)."""

from hanlm.demo.world import FACTS, FILE_NAMES, PLANT_STYLES, DemoWorld, Fact, build, write
from hanlm.korean import josa
from hanlm.testsets.readers import item_text

__all__ = [
    "FACTS",
    "FILE_NAMES",
    "PLANT_STYLES",
    "DemoWorld",
    "Fact",
    "build",
    "item_text",
    "josa",
    "write",
]
