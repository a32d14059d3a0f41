"""The tokenizer of the model pretraining continues from (`model.init_from`), kept or extended.

Kept, the tokenizer stage trains nothing: `RUN/tokenizer/` is the model's own tokenizer as
transformers saves it, and special_tokens.json names what the later stages need from it. A
document ends with the model's end-of-text token (its eos) and begins with its BOS only where
its tokenizer adds one (a Llama's `<s>`, not a Qwen2's): no token of hanlm's is added. Where the
tokenizer has a chat template of its own, its tokens are named as hanlm.chat.foreign reads them.

Extended (`tokenizer.extend = N`): a BPE tokenizer of the model's own kind (its normaliser and
pre-tokenizer: transformers' `train_new_from_iterator`) is trained on the corpus sample, and its
N most frequent tokens (by merge order) whose text the model's tokenizer does not already hold
as one token are added to it, as tokens matched in raw text before the model's own pieces (a
leading space kept, as the model's own word tokens have it). Their rows are made when the model
is built (hanlm.train.init_from): `pieces` (default) gives a new token the mean of the model's
rows for the pieces its old tokenizer splits the token's text into, `mean` the mean of every
ordinary row. The held-out characters per token before and after are in stats.json.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tokenizers import AddedToken

from hanlm.chat import foreign
from hanlm.chat_template import SPECIAL_TOKENS_FILE
from hanlm.config import Config
from hanlm.data.tokenizer import (
    TOKENIZER_FILE,
    TokenizerStats,
    compression,
    sample_texts,
)
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, file_sha256

# the files a Hugging Face tokenizer folder may hold (a fast tokenizer's, and a slow one's)
TOKENIZER_FILES = (
    TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
)  # fmt: skip
EXTENSION_FILE = "extension.json"  # the added tokens, their text's old pieces, the rule
REPLACEMENT = "\ufffd"  # a piece that is not whole UTF-8


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts its BOS before a text of its own accord."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a").input_ids[:1] == [bos]


def special_tokens(tokenizer, where: str) -> dict:
    """special_tokens.json for a model's tokenizer: end of document (its eos), padding, the BOS
    that starts documents where it adds one, its chat template's tokens where it has one, and
    its other special tokens as the audit's reference rows."""
    if tokenizer.eos_token is None:
        raise UserError(
            f"the tokenizer of {where} has no eos token: documents need an end",
            where=where,
            fix="give a model whose tokenizer names its eos_token (tokenizer_config.json)",
        )
    if tokenizer.chat_template:
        out = foreign.special_tokens_of(tokenizer, where)
    else:
        eos = {"token": tokenizer.eos_token, "id": tokenizer.eos_token_id}
        pad = tokenizer.pad_token or tokenizer.eos_token
        out = {"eod": eos, "pad": {"token": pad, "id": tokenizer.convert_tokens_to_ids(pad)}}
        if tokenizer.bos_token is not None:
            out["bos"] = {"token": tokenizer.bos_token, "id": tokenizer.bos_token_id}
        used = {v["token"] for v in out.values()}
        out["reserved"] = [
            {"token": str(t.content), "id": i}
            for i, t in sorted(tokenizer.added_tokens_decoder.items())
            if t.special and str(t.content) not in used
        ]
    out["document_start"] = out.get("bos") if adds_bos(tokenizer) else None
    out["vocab_size"] = len(tokenizer)
    out["base_model"] = where
    return out


def new_tokens(base, texts: list[str], count: int) -> list[str]:
    """The `count` most frequent tokens of a tokenizer of `base`'s kind trained on `texts`
    whose text `base` does not already hold as one token, as text."""
    # a byte alphabet and 8 merges per token asked for: most of a corpus-trained vocabulary's
    # frequent tokens are ones the model's tokenizer has too (whatever its size)
    trained = base.train_new_from_iterator(texts, vocab_size=512 + 8 * count, length=len(texts))
    found: list[str] = []
    for piece, _ in sorted(trained.get_vocab().items(), key=lambda kv: kv[1]):
        if piece in trained.all_special_tokens:
            continue
        text = trained.convert_tokens_to_string([piece])
        if len(text.strip()) < 2 or REPLACEMENT in text or text in found:
            continue  # a byte or a character: the model has them; a piece of a character
        if len(base(text, add_special_tokens=False).input_ids) < 2:
            continue
        found.append(text)
        if len(found) == count:
            return found
    if not found:
        raise UserError(
            f"the corpus sample gave no token the tokenizer of the model lacks "
            f"(tokenizer.extend = {count})",
            fix="drop tokenizer.extend, or give more text (tokenizer.sample_chars)",
        )
    return found


def adopt(base_dir: Path, corpus_dir: Path, cfg: Config, out: Path) -> TokenizerStats:
    """Write the model's tokenizer (extended with `tokenizer.extend` tokens) into `out`."""
    from hanlm.inference import load_tokenizer  # deferred: transformers, for this stage only

    started = time.perf_counter()
    tokenizer = load_tokenizer(base_dir)
    texts, heldout, sample_chars = sample_texts(corpus_dir, cfg)
    before = compression(tokenizer.backend_tokenizer, heldout, add_special_tokens=False)
    extension: dict | None = None
    count = cfg.tokenizer.extend
    if count:
        added = new_tokens(tokenizer, texts, count)
        pieces = {t: tokenizer(t, add_special_tokens=False).input_ids for t in added}
        tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in added])
        extension = {
            "init": cfg.tokenizer.extend_init,
            "tokens": [
                {"token": t, "id": tokenizer.convert_tokens_to_ids(t), "pieces": pieces[t]}
                for t in added
            ],
        }
    if extension is None:  # kept: the model's own files, byte for byte
        out.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (base_dir / name).is_file():
                shutil.copyfile(base_dir / name, out / name)
    else:
        tokenizer.save_pretrained(out)
    special = special_tokens(tokenizer, str(base_dir))
    atomic_write_json(out / SPECIAL_TOKENS_FILE, special)
    if extension is not None:
        atomic_write_json(out / EXTENSION_FILE, extension)
    return TokenizerStats(
        vocab_size=special["vocab_size"],
        sample_documents=len(texts),
        sample_characters=sample_chars,
        heldout=compression(tokenizer.backend_tokenizer, heldout, add_special_tokens=False),
        tokenizer_sha256=file_sha256(out / TOKENIZER_FILE),
        seconds=round(time.perf_counter() - started, 3),
        base_model=str(base_dir),
        added_tokens=count and len(extension["tokens"]),
        heldout_before=before,
    )
