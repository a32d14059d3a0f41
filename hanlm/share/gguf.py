"""A GGUF file for llama.cpp and Ollama from an exported Hugging Face Llama folder.

What llama.cpp's own `convert_hf_to_gguf.py` would write for a Llama, without its guesswork:

* architecture `llama` and its hyperparameters from config.json;
* tensors under llama.cpp's names, the Q and K projections permuted from Hugging Face's RoPE
  layout (two halves) to llama.cpp's (interleaved pairs), as the converter's `LlamaModel.permute`
  does; tied embeddings write no `output.weight` (llama.cpp reuses `token_embd`); norms stay F32,
  matrices become f16, bf16, q8_0 or f32 (a q8_0 row must hold whole blocks of 32, else it stays f16);
* the tokenizer: byte-level BPE (`gpt2`) with the pre-tokenizer type that splits text exactly as
  hanlm's (`qwen2`; `smollm` for tokenizers trained before issue 19), every token with its type
  (special tokens are control tokens), the merges, bos/eos/eot/pad ids, no BOS added (hanlm adds
  none) and the chat template without transformers' `{% generation %}` markers.

Next to it goes an Ollama Modelfile: FROM the file, the chat template in Go's template
language, the end-of-turn token as a stop and the decoding defaults of [generate].

The file is written under a temporary name, fsynced and renamed: a half-written GGUF never sits
at the output path. The `gguf` package is optional (`pip install 'hanlm[gguf]'`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open

from hanlm.chat_template import (
    ASSISTANT,
    CHAT_TEMPLATE,
    END_OF_TURN,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
)
from hanlm.data.tokenizer import TOKENIZER_FILE, llama_cpp_pre_type
from hanlm.errors import UserError
from hanlm.files import claim_output_file, fsync_dir, read_json
from hanlm.model_folder import CONFIG, WEIGHTS, check_model_folder

if TYPE_CHECKING:
    from hanlm.config import GenerateSection

GGUF_TYPES = ("f16", "bf16", "q8_0", "f32")  # f32: exact, for tests and tiny models
ARCHITECTURE = "llama"
GGUF_MAGIC = b"GGUF"
# transformers' marker of the assistant's tokens for SFT masks: no other Jinja engine knows it
_GENERATION_TAG = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")
# Hugging Face name (after `model.`) -> llama.cpp name, inside a block and outside
_BLOCK_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_OUTER_TENSORS = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}
_BLOCK_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def require_gguf():
    """The `gguf` package, or a UserError naming the extra that installs it."""
    try:
        import gguf  # deferred: an optional extra, needed only when writing GGUF
    except ImportError as e:
        raise UserError(
            "GGUF export needs the `gguf` package, which is not installed",
            fix="pip install 'hanlm[gguf]' (or: pip install gguf)",
        ) from e
    return gguf


# --- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    """The hyperparameters llama.cpp's `llama` architecture reads, from a config.json."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    context: int
    rope_theta: float
    rms_eps: float
    tied: bool


def llama_shape(config: dict, where: str) -> LlamaShape:
    """The shape of a Llama config.json; a UserError for anything llama.cpp's `llama`
    architecture would run differently (another model type, biases, RoPE scaling)."""
    if config.get("model_type") != "llama":
        raise UserError(
            f"GGUF export writes Llama models; this folder holds a {config.get('model_type')!r} model",
            where=where,
            fix="export a hanlm model (its presets are Llama), or convert this one with "
            "llama.cpp's convert_hf_to_gguf.py",
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    unsupported = [
        name
        for name, present in (
            ("attention_bias", config.get("attention_bias")),
            ("mlp_bias", config.get("mlp_bias")),
            (f"rope type {rope_type!r}", rope_type != "default"),
            (f"activation {config.get('hidden_act')!r}", config.get("hidden_act") != "silu"),
        )
        if present
    ]
    if unsupported:
        raise UserError(
            f"this Llama config uses {', '.join(unsupported)}, which hanlm's GGUF export does "
            "not write",
            where=where,
            fix="use llama.cpp's convert_hf_to_gguf.py for this model",
        )
    try:
        return _shape(config, rope)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(
            f"config.json lacks or mangles the Llama setting {e}",
            where=where,
            fix="export the model again with `hanlm export`",
        ) from e


def _shape(config: dict, rope: dict) -> LlamaShape:
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return LlamaShape(
        layers=int(config["num_hidden_layers"]),
        hidden=hidden,
        ffn=int(config["intermediate_size"]),
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        context=int(config["max_position_embeddings"]),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10_000.0))),
        rms_eps=float(config["rms_norm_eps"]),
        tied=bool(config.get("tie_word_embeddings", False)),
    )


def rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a Q or K projection from Hugging Face's rotary layout to llama.cpp's.

    Hugging Face rotates the two halves of each head's dimensions (`rotate_half`); llama.cpp
    (like Meta's original weights) rotates adjacent pairs. Within each head, row j of the first
    half and row j of the second become rows 2j and 2j+1 (convert_hf_to_gguf's permute).
    """
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def unpermute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `rope_permute`: llama.cpp's rows back in Hugging Face's order."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensor_name(hf_name: str) -> str | None:
    """llama.cpp's name of a Hugging Face Llama tensor, None for one it has no use for."""
    stem, _, suffix = hf_name.rpartition(".")
    if suffix != "weight":
        return None
    if stem in _OUTER_TENSORS:
        return f"{_OUTER_TENSORS[stem]}.weight"
    match = _BLOCK_NAME.fullmatch(stem)
    if match and match.group(2) in _BLOCK_TENSORS:
        return f"blk.{match.group(1)}.{_BLOCK_TENSORS[match.group(2)]}.weight"
    return None


def _tensor_plan(names: list[str], shape: LlamaShape, where: str) -> list[tuple[str, str]]:
    """(Hugging Face name, llama.cpp name) of every tensor to write, in llama.cpp's order."""
    plan = {}
    for name in names:
        target = gguf_tensor_name(name)
        if target is None:
            raise UserError(
                f"tensor {name!r} has no place in llama.cpp's Llama",
                where=where,
                fix="export a plain Llama model (hanlm's presets are)",
            )
        if target == "output.weight" and shape.tied:
            continue  # tied: llama.cpp reads the output projection from token_embd
        plan[target] = name
    expected = ["token_embd.weight", "output_norm.weight"]
    expected += [] if shape.tied else ["output.weight"]
    expected += [
        f"blk.{i}.{tensor}.weight"
        for i in range(shape.layers)
        for tensor in _BLOCK_TENSORS.values()
    ]
    missing = [tensor for tensor in expected if tensor not in plan]
    if missing:
        raise UserError(
            f"the weights lack {len(missing)} tensors llama.cpp needs (first: {missing[0]})",
            where=where,
            fix="export the model again with `hanlm export`",
        )
    return [(plan[tensor], tensor) for tensor in expected]


# --- the tokenizer --------------------------------------------------------------------------------


@dataclass
class Vocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    add_bos: bool


def read_vocab(folder: Path, vocab_size: int, gguf) -> Vocab:
    """Tokens (padded to the model's vocabulary), their types and the merges of tokenizer.json."""
    where = str(folder / TOKENIZER_FILE)
    tokenizer = read_json(folder / TOKENIZER_FILE)
    pre = llama_cpp_pre_type(tokenizer)
    if pre is None:
        raise UserError(
            "this tokenizer's pre-tokenizer is none that llama.cpp implements, so llama.cpp "
            "would split text differently than the model was trained on",
            where=where,
            fix="train the tokenizer with hanlm (`hanlm tokenizer --force`, then pretrain "
            "again): its pre-tokenizer is llama.cpp's `qwen2`",
        )
    model = tokenizer["model"]
    by_id: dict[int, str] = {token_id: token for token, token_id in model["vocab"].items()}
    special: set[int] = set()
    for added in tokenizer.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    added_ids = {entry["id"] for entry in tokenizer.get("added_tokens", [])}
    if max(by_id) >= vocab_size:
        raise UserError(
            f"the tokenizer has token id {max(by_id)}, beyond the model's vocabulary of {vocab_size}",
            where=where,
            fix="export the model with the tokenizer it was trained with",
        )
    tokens, types = [], []
    for token_id in range(vocab_size):
        if token_id not in by_id:
            tokens.append(f"[PAD{token_id}]")  # rows the model has and the tokenizer never produces
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[token_id])
        if token_id in special:
            types.append(gguf.TokenType.CONTROL)
        elif token_id in added_ids:
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [
        merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])
    ]
    return Vocab(
        tokens, [int(token_type) for token_type in types], merges, pre, _adds_bos(tokenizer)
    )


def _adds_bos(tokenizer: dict) -> bool:
    """Whether encoding puts a special token first (hanlm's tokenizers add nothing)."""
    post = tokenizer.get("post_processor") or {}
    single = post.get("single") or []
    return post.get("type") == "TemplateProcessing" and bool(single) and "SpecialToken" in single[0]


def plain_chat_template(template: str) -> str:
    """The chat template without transformers' `{% generation %}` markers, which only say what
    SFT trains on: llama.cpp's and Python's Jinja engines render the same text without them."""
    return _GENERATION_TAG.sub("", template)


def _special_ids(folder: Path) -> dict[str, int]:
    path = folder / SPECIAL_TOKENS_FILE
    if not path.is_file():
        raise UserError(
            f"the folder has no {SPECIAL_TOKENS_FILE}, which names hanlm's special tokens",
            where=str(folder),
            fix="give a folder `hanlm export` or `hanlm sft` wrote",
        )
    special = read_json(path)
    return {name: int(special[name]["id"]) for name in ("bos", "eod", "pad", "eot")}


# --- writing --------------------------------------------------------------------------------------


def _qtype(gguf, gguf_type: str, tensor_name: str, row: int):
    quant = gguf.GGMLQuantizationType
    if tensor_name.endswith("_norm.weight"):
        return quant.F32  # llama.cpp keeps 1-D tensors in F32
    if gguf_type == "q8_0":
        block = gguf.GGML_QUANT_SIZES[quant.Q8_0][0]
        return quant.Q8_0 if row % block == 0 else quant.F16  # as the converter falls back
    return {"f16": quant.F16, "bf16": quant.BF16, "f32": quant.F32}[gguf_type]


def _file_type(gguf, gguf_type: str) -> int:
    ft = gguf.LlamaFileType
    types = {
        "f16": ft.MOSTLY_F16,
        "bf16": ft.MOSTLY_BF16,
        "q8_0": ft.MOSTLY_Q8_0,
        "f32": ft.ALL_F32,
    }
    return int(types[gguf_type])


def is_gguf_file(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _check_folder(folder: Path) -> None:
    check_model_folder(folder, tokenizer=True)
    if not (folder / WEIGHTS).is_file() or not (folder / TOKENIZER_FILE).is_file():
        raise UserError(
            f"GGUF export reads one {WEIGHTS} and a {TOKENIZER_FILE}; this folder lacks "
            "one of them (sharded weights, or a slow tokenizer?)",
            where=str(folder),
            fix="give a folder `hanlm export` wrote",
        )


def _add_metadata(writer, gguf, shape, vocab, special: dict, template: str | None) -> None:
    """The model's shape, its tokenizer and its chat template, as llama.cpp reads them."""
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    if shape.head_dim * shape.heads != shape.hidden:  # llama.cpp assumes hidden / heads otherwise
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(special["bos"])
    writer.add_eos_token_id(special["eod"])
    writer.add_eot_token_id(special["eot"])  # a chat turn ends here: llama.cpp stops on it
    writer.add_pad_token_id(special["pad"])
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    if template:
        writer.add_chat_template(plain_chat_template(template))


def _add_tensor_infos(writer, gguf, weights, plan, gguf_type: str) -> tuple[dict, dict]:
    """(target name -> its quantization type, quantization type -> tensors) for `plan`."""
    qtypes, counts = {}, {}
    for hf_name, target in plan:
        dims = weights.get_slice(hf_name).get_shape()
        qtype = _qtype(gguf, gguf_type, target, dims[-1])
        qtypes[target] = qtype
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(dims)) // block * size
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16
            writer.add_tensor_info(target, dims, np.dtype(dtype), nbytes, raw_dtype=qtype)
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(dims, qtype)
            writer.add_tensor_info(target, byte_shape, np.dtype(np.uint8), nbytes, qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return qtypes, counts


def _write_file(writer, gguf, weights, plan, qtypes: dict, shape, out: Path) -> None:
    """The header, metadata and tensors into a temporary file, renamed to `out` once whole."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for hf_name, target in plan:
            data = weights.get_tensor(hf_name).to(torch.float32).numpy()
            if target.endswith("attn_q.weight"):
                data = rope_permute(data, shape.heads)
            elif target.endswith("attn_k.weight"):
                data = rope_permute(data, shape.kv_heads)
            writer.write_tensor_data(gguf.quants.quantize(data, qtypes[target]))
        writer.flush()
        for f in writer.fout or []:
            os.fsync(f.fileno())
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)


def write_gguf(
    folder: Path,
    out: Path,
    *,
    gguf_type: str = "f16",
    name: str | None = None,
    replace_earlier: bool = False,
) -> dict[str, Any]:
    """Write the Llama model of the Hugging Face folder `folder` as the GGUF file `out`."""
    if gguf_type not in GGUF_TYPES:
        raise UserError(
            f"unknown GGUF type {gguf_type!r}", fix=f"use one of {', '.join(GGUF_TYPES)}"
        )
    gguf = require_gguf()
    folder, out = Path(folder), Path(out)
    _check_folder(folder)
    claim_output_file(
        out, is_earlier_output=is_gguf_file, replace_earlier=replace_earlier, name="GGUF file"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    shape = llama_shape(read_json(folder / CONFIG), str(folder / CONFIG))
    vocab = read_vocab(folder, shape.vocab_size, gguf)
    template = read_json(folder / TOKENIZER_CONFIG_FILE).get("chat_template")

    writer = gguf.GGUFWriter(None, ARCHITECTURE)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or folder.name)
    writer.add_file_type(_file_type(gguf, gguf_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_metadata(writer, gguf, shape, vocab, _special_ids(folder), template)
    with safe_open(folder / WEIGHTS, framework="pt") as weights:
        plan = _tensor_plan(list(weights.keys()), shape, str(folder / WEIGHTS))
        qtypes, counts = _add_tensor_infos(writer, gguf, weights, plan, gguf_type)
        _write_file(writer, gguf, weights, plan, qtypes, shape, out)
    fsync_dir(out.parent)
    return {
        "out": str(out),
        "source": str(folder),
        "gguf_type": gguf_type,
        "pre_tokenizer": vocab.pre,
        "tensors": counts,
        "bytes": out.stat().st_size,
        "vocab_size": shape.vocab_size,
        "tied_embeddings": shape.tied,
    }


# --- Ollama ---------------------------------------------------------------------------------------


def ollama_template() -> str:
    """hanlm's chat template (hanlm.chat_template) in Go's template language, as Ollama renders
    `.Messages`: each turn `<|role|>\\n{content}<|eot|>\\n`, then `<|assistant|>\\n` to answer
    (or the last assistant message left open, to be continued)."""
    return (
        "{{- range $i, $_ := .Messages }}"
        "{{- $last := eq (len (slice $.Messages $i)) 1 }}"
        '{{- if and $last (eq .Role "assistant") }}' + ASSISTANT + "\n{{ .Content }}"
        "{{- else }}<|{{ .Role }}|>\n{{ .Content }}" + END_OF_TURN + "\n"
        "{{ if $last }}" + ASSISTANT + "\n{{ end }}"
        "{{- end }}"
        "{{- end }}"
    )


def modelfile(gguf_file: Path, chat_template: str | None, generate: GenerateSection) -> str:
    """An Ollama Modelfile for `gguf_file` (named relative to the Modelfile's folder)."""
    lines = [f"FROM ./{Path(gguf_file).name}", ""]
    if chat_template == CHAT_TEMPLATE:
        lines += [f'TEMPLATE """{ollama_template()}"""', ""]
    else:  # a template hanlm did not write: Ollama falls back to the GGUF's own
        lines += ["# the folder's chat template is not hanlm's: no TEMPLATE written", ""]
    lines += [
        f'PARAMETER stop "{END_OF_TURN}"',
        f"PARAMETER repeat_penalty {generate.repetition_penalty}",
    ]
    if generate.greedy:
        lines.append("PARAMETER temperature 0")
    else:
        lines += [
            f"PARAMETER temperature {generate.temperature}",
            f"PARAMETER top_k {generate.top_k}",
            f"PARAMETER top_p {generate.top_p}",
        ]
    return "\n".join(lines) + "\n"
