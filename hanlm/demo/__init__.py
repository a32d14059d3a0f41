"""The built-in synthetic Korean world of the demo pipeline.

One seed gives everything the later stages need to run end to end without downloading data:

* pretraining documents: encyclopedia paragraphs about real countries (`encyclopedia`), arithmetic
  word problems with worked answers ending in `#### N` (`word_problems`), and everyday writing:
  diaries, letters, short essays, recipes (`everyday`);
* reading exercises: a paragraph about a country with questions, each followed by its answer
  (`exercises`), as workbooks and quiz sites put them on the web;
* a two-choice benchmark (`benchmark`) of passages of its own asking the facts the documents
  state (a country's capital or continent), a recorded part of which is planted into the documents, several mirrored copies per item, in
  one of four styles (`planting`), so decontamination has real leaks to find and real non-leaks
  to leave alone, and the eval a memorised leak to measure;
* chat conversations for SFT, kept out of the pretraining documents (`chat`);
* the table of capital facts behind it all (`facts`).

`world` builds and writes it. The Hangul text lives in data files, `templates/*.toml`
(`templating` reads and fills them; `draws` runs the value descriptions of word problems and
benchmark scenarios). Capitals are stated country first ("A의 수도는 B이다"), and object first
("B는 A의 수도이다") only for the facts `reverse_share` picks, so a later probe can honestly ask
whether a model learned the reverse direction of the others.

Stdlib only and cheap to import: corpus workers and tests import it without paying for torch.
"""

from hanlm.demo.facts import FACTS, Fact
from hanlm.demo.planting import PLANT_STYLES
from hanlm.demo.world import FILE_NAMES, DemoWorld, build, write
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
