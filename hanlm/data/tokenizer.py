"""`hanlm tokenizer`: a byte-level BPE tokenizer trained on the corpus with Hugging Face `tokenizers`.

NFC normaliser, digits split one by one, and every special token the later stages need (document
boundaries, padding, chat roles, end of turn, a spare block) reserved at the lowest ids from the
first training, so the chat tokens exist even if pretraining never shows them.

The pre-tokenizer is one llama.cpp implements, so that a GGUF export tokenises exactly as hanlm
does: Qwen2's split (llama.cpp's pre-tokenizer type `qwen2`): a letter run keeps one leading
space or punctuation mark, every digit stands alone, newlines group, then byte-level mapping.
llama.cpp applies no normaliser; the NFC normaliser stays here because it changes nothing on the
NFC text the corpus stage writes, and keeps un-normalised input working in hanlm itself.
Tokenizers trained before (digits split, then GPT-2's byte-level regex) still load and work:
they equal llama.cpp's `smollm` type (`llama_cpp_pre_type` tells the two apart).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from hanlm.chat_template import (
    ASSISTANT,
    CHAT_TEMPLATE,
    END_OF_TURN,
    SPECIAL_TOKENS_FILE,
    SYSTEM,
    TOKENIZER_CONFIG_FILE,
    USER,
)
from hanlm.config import Config
from hanlm.data import corpus as corpus_lib
from hanlm.errors import UserError
from hanlm.files import atomic_write_json, file_mismatch, file_sha256, read_json
from hanlm.results import Part, Result

STAGE = "tokenizer"
TOKENIZER_FILE = "tokenizer.json"
STATS_FILE = "stats.json"
BOS = "<|bos|>"
END_OF_DOCUMENT = "<|endoftext|>"
PAD = "<|pad|>"
VOCAB_MULTIPLE = 64  # tensor-core friendly embedding and head shapes
MODEL_MAX_LENGTH = 1 << 20  # the tokenizer has no length limit of its own; the model sets one
# Longest text the tokenizers library is given at once. It holds ~250 bytes per character of the
# text it encodes (one 8.7M-character document took 2.1 GB), so longer documents go in pieces.
PIECE_CHARS = 1 << 20
TRAIN_PIECE_CHARS = 1 << 16  # training: the trainer holds one text per thread, on every core
# Qwen2's pre-tokenizer regex, as its tokenizer.json writes it; llama.cpp's `qwen2` type is this
# regex (with the case-insensitive group spelt out), in src/llama-vocab.cpp and src/unicode.cpp.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def core_special_tokens() -> dict[str, str]:
    return {
        "bos": BOS,
        "eod": END_OF_DOCUMENT,
        "pad": PAD,
        "system": SYSTEM,
        "user": USER,
        "assistant": ASSISTANT,
        "eot": END_OF_TURN,
    }


def reserved_token(i: int) -> str:
    return f"<|reserved_{i}|>"


def round_up(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


def build_untrained():
    """The tokenizer pipeline: NFC, Qwen2's split (digits one by one), byte-level mapping."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def cut_points(text: str, max_chars: int) -> list[int]:
    """Where to cut `text` into pieces of at most `max_chars` characters that hanlm's tokenizers
    encode into exactly the tokens of the whole text, end to end (none when it is that short).

    A cut goes before a space that follows a non-space character. Under both pre-tokenizers
    hanlm has used (`qwen2`, and `smollm` before issue 19) no pre-token runs from a non-space
    character into the space after it, so the whole text has a pre-token boundary there; the
    one rule that looks ahead (`\\s+(?!\\S)`) ends only whitespace runs, which cannot end there;
    and no rule looks back, so the rest is split as in the whole text. No NFC composition
    crosses a space either. Failing such a space in the window: before a line break that follows
    a letter or digit (a letter or digit run ends there too). A window of `max_chars` characters
    with neither is cut at its end, where the tokens around the cut may differ from the whole's.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    cuts: list[int] = []
    start = 0
    while len(text) - start > max_chars:
        start = _cut(text, start + 1, start + max_chars)
        cuts.append(start)
    return cuts


def _cut(text: str, lo: int, hi: int) -> int:
    """The last safe cut in [lo, hi] (lo >= 1), else hi; see cut_points."""
    at = text.rfind(" ", lo, hi + 1)
    while at >= lo:
        if not text[at - 1].isspace():
            return at
        at = text.rfind(" ", lo, at)
    at = text.rfind("\n", lo, hi + 1)
    while at >= lo:
        if text[at - 1].isalnum():
            return at
        at = text.rfind("\n", lo, at)
    return hi


def text_pieces(text: str, max_chars: int = PIECE_CHARS) -> Iterator[str]:
    """`text` cut at cut_points, one piece at a time: their tokens, end to end, are the whole
    text's."""
    cuts = cut_points(text, max_chars)
    if not cuts:
        yield text
        return
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        yield text[a:b]


def pieces_of(texts: Iterable[str], max_chars: int = PIECE_CHARS) -> Iterator[str]:
    """Every text in order, each long one as its text_pieces."""
    for text in texts:
        if len(text) <= max_chars:
            yield text
        else:
            yield from text_pieces(text, max_chars)


def llama_cpp_pre_type(tokenizer_json: dict) -> str | None:
    """The llama.cpp pre-tokenizer type (`tokenizer.ggml.pre`) that splits text exactly as this
    tokenizer.json does, or None when llama.cpp has none that does.

    `qwen2` for hanlm's tokenizers; `smollm` for those trained before issue 19 (digits split,
    then GPT-2's regex: SmolLM's and StarCoder's pipeline, llama.cpp's regexes `\\p{N}` then
    GPT-2's). Both also need a plain byte-level BPE: no byte fallback, merges always applied.
    """
    model = tokenizer_json.get("model") or {}
    normalizer = tokenizer_json.get("normalizer")
    if (
        model.get("type") != "BPE"
        or model.get("byte_fallback")
        or model.get("ignore_merges")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or (normalizer is not None and normalizer.get("type") != "NFC")
        or (tokenizer_json.get("decoder") or {}).get("type") != "ByteLevel"
    ):
        return None
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if len(steps) != 2 or steps[1].get("type") != "ByteLevel" or steps[1].get("add_prefix_space"):
        return None
    split, byte_level = steps
    if (
        split.get("type") == "Split"
        and split.get("pattern") == {"Regex": QWEN2_SPLIT}
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and not byte_level.get("use_regex")
    ):
        return "qwen2"
    if split == {"type": "Digits", "individual_digits": True} and byte_level.get("use_regex"):
        return "smollm"
    return None


def sample_texts(corpus_dir: Path, cfg: Config) -> tuple[list[str], list[str], int]:
    """Seeded sample of documents: held-out ones (for compression figures) and training text."""
    tokenizer_cfg = cfg.tokenizer
    stats_path = corpus_dir / corpus_lib.STATS_FILE
    stats = read_json(stats_path) if stats_path.is_file() else {}
    total_chars = max(1, int(stats.get("characters_out", 0)) or 1)
    total_docs = max(1, int(stats.get("documents_out", 0)) or 1)
    keep = 1.0 if not stats else min(1.0, tokenizer_cfg.sample_chars / total_chars)
    heldout_rate = min(0.5, 2.0 * tokenizer_cfg.heldout_docs / total_docs) if stats else 0.02
    rng = random.Random(f"tokenizer-sample-{cfg.run.seed}")
    heldout: list[str] = []
    train: list[str] = []
    train_chars = 0
    for doc in corpus_lib.iter_corpus(corpus_dir):
        draw = rng.random()
        if draw < heldout_rate and len(heldout) < tokenizer_cfg.heldout_docs:
            heldout.append(doc["text"])
        elif (draw < keep or not stats) and train_chars < tokenizer_cfg.sample_chars:
            train.append(doc["text"])
            train_chars += len(doc["text"])
        if train_chars >= tokenizer_cfg.sample_chars and len(heldout) >= tokenizer_cfg.heldout_docs:
            break
    if not heldout and len(train) > 1:
        heldout.append(train.pop())  # a tiny corpus still gets a compression figure
    if not train:
        raise UserError(
            f"no training text for the tokenizer in {corpus_dir}",
            fix="give the corpus stage more documents, or lower tokenizer.heldout_docs",
        )
    return train, heldout, train_chars


def train(texts: list[str], vocab_size: int, min_frequency: int, reserved: int):
    """Train and pad the vocabulary to a multiple of 64 with extra reserved tokens."""
    specials = [*core_special_tokens().values()] + [reserved_token(i) for i in range(reserved)]
    target = round_up(vocab_size)
    if target < len(specials) + 256 + VOCAB_MULTIPLE:
        raise UserError(
            f"tokenizer.vocab_size {vocab_size} leaves no room for merges after the 256 byte "
            f"tokens and {len(specials)} special tokens",
            fix=f"use at least {round_up(len(specials) + 256 + VOCAB_MULTIPLE)}",
        )
    tok = build_untrained()
    trainer = trainers.BpeTrainer(
        vocab_size=target,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Long documents in pieces: the counts of pre-tokens (all a BPE trainer sees) are the same.
    pieces = pieces_of(texts, TRAIN_PIECE_CHARS)
    tok.train_from_iterator(pieces, trainer=trainer, length=len(texts))
    size = tok.get_vocab_size(with_added_tokens=True)
    padding = [reserved_token(reserved + i) for i in range(round_up(size) - size)]
    if padding:
        tok.add_special_tokens(padding)
    return tok


def save(tok, out_dir: Path) -> dict:
    """Write a folder that `transformers.AutoTokenizer.from_pretrained` loads, plus special_tokens.json."""
    from transformers import PreTrainedTokenizerFast  # deferred: transformers, only to save

    core = core_special_tokens()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=core["bos"],
        eos_token=core["eod"],
        pad_token=core["pad"],
        additional_special_tokens=[core[k] for k in ("system", "user", "assistant", "eot")],
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH,
    )
    hf.chat_template = CHAT_TEMPLATE
    # The template stays inside tokenizer_config.json, where every consumer looks for it.
    hf.save_pretrained(out_dir, save_jinja_files=False)
    _portable_config(out_dir / TOKENIZER_CONFIG_FILE)
    vocab = tok.get_vocab(with_added_tokens=True)
    specials = {name: {"token": t, "id": vocab[t]} for name, t in core.items()}
    reserved = sorted(
        (vocab[t], t) for t in vocab if t.startswith("<|reserved_") and t.endswith("|>")
    )
    special_tokens = {
        **specials,
        "reserved": [{"token": t, "id": i} for i, t in reserved],
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }
    atomic_write_json(out_dir / SPECIAL_TOKENS_FILE, special_tokens)
    return special_tokens


def _portable_config(path: Path) -> None:
    """Name the tokenizer class and extra tokens the way transformers 4 and 5 (and vLLM,
    lm-evaluation-harness) all read them, not transformers 5's own new spelling."""
    config = read_json(path)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    atomic_write_json(path, config)


def compression(tok, texts: list[str], *, add_special_tokens: bool = True) -> dict:
    tokens = 0
    for batch in _batches(pieces_of(texts), PIECE_CHARS):  # bounded memory, the same counts
        encoded = tok.encode_batch_fast(batch, add_special_tokens=add_special_tokens)
        tokens += sum(len(e.ids) for e in encoded)
    chars = sum(len(t) for t in texts)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    return {
        "documents": len(texts),
        "tokens": tokens,
        "chars_per_token": round(chars / max(tokens, 1), 4),
        "bytes_per_token": round(nbytes / max(tokens, 1), 4),
    }


def _batches(texts: Iterable[str], max_chars: int) -> Iterator[list[str]]:
    """Texts in groups of at most `max_chars` characters (a longer text alone)."""
    batch: list[str] = []
    chars = 0
    for text in texts:
        if batch and chars + len(text) > max_chars:
            yield batch
            batch, chars = [], 0
        batch.append(text)
        chars += len(text)
    if batch:
        yield batch


class Compression(Part):
    """Held-out documents encoded: how many characters and bytes one token covers."""

    documents: int
    tokens: int
    chars_per_token: float
    bytes_per_token: float


class TokenizerStats(Result):
    """`tokenizer/stats.json`: the vocabulary, the sample trained on, the held-out compression
    and the sha256 of tokenizer.json (what the shards are checked against)."""

    FILE = STATS_FILE
    MADE_BY = "tokenizer"

    vocab_size: int
    sample_documents: int
    sample_characters: int
    heldout: Compression
    tokenizer_sha256: str
    seconds: float
    # continued pretraining (hanlm.data.base_tokenizer): the model whose tokenizer this is, the
    # tokens added to it and its held-out compression before they were
    base_model: str | None = None
    added_tokens: int = 0
    heldout_before: Compression | None = None


def build(corpus_dir: Path, cfg: Config, out: Path) -> TokenizerStats:
    """Train on a sample of the corpus folder and save it into `out`; its stats (which the
    pipeline keeps as stats.json)."""
    started = time.perf_counter()
    texts, heldout, sample_chars = sample_texts(corpus_dir, cfg)
    tokenizer_cfg = cfg.tokenizer
    tok = train(
        texts, tokenizer_cfg.vocab_size, tokenizer_cfg.min_frequency, tokenizer_cfg.reserved_tokens
    )
    special = save(tok, out)
    stats = TokenizerStats(
        vocab_size=special["vocab_size"],
        sample_documents=len(texts),
        sample_characters=sample_chars,
        heldout=compression(tok, heldout),
        tokenizer_sha256=file_sha256(out / TOKENIZER_FILE),
        seconds=round(time.perf_counter() - started, 3),
    )
    return stats


def damage(folder: Path) -> str | None:
    """What is wrong with a finished tokenizer folder: tokenizer.json must still have the
    sha256 stats.json records (a small file: always checked in full)."""
    try:
        record = {"sha256": TokenizerStats.read(folder / STATS_FILE).tokenizer_sha256}
    except UserError:
        return "stats.json cannot be read"
    problem = file_mismatch(folder / TOKENIZER_FILE, record)
    missing = [
        n for n in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE) if not (folder / n).is_file()
    ]
    return problem or (f"{', '.join(missing)} missing" if missing else None)


def load(tokenizer_json: Path):
    """A trained tokenizer.json as a `tokenizers.Tokenizer` (fast, no transformers import)."""
    return Tokenizer.from_file(str(tokenizer_json))


def token_byte_lengths(tok) -> list[int]:
    """UTF-8 bytes each token stands for (0 for special tokens): the denominator of bits per byte.

    In byte-level BPE every character of a token's string is exactly one byte of text.
    """
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder().values()
    special = {t.content for t in added if t.special}
    # tokens added whole (a vocabulary extension) are matched in raw text: their UTF-8 bytes
    raw = {t.content for t in added if not t.special}
    lengths = [0] * tok.get_vocab_size(with_added_tokens=True)
    for token, i in vocab.items():
        if token in special:
            lengths[i] = 0
        elif token in raw:
            lengths[i] = len(token.encode("utf-8"))
        else:
            lengths[i] = len(token)
    return lengths
