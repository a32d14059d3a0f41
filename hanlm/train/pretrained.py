"""A pretrained model's weights read straight into a model already placed on its ranks.

SFT starts from a pretrained model: a Hugging Face folder (safetensors) or a pretraining
checkpoint (torch.distributed.checkpoint). Loading it whole on every rank and then sharding it
costs each rank the whole model in host memory. Instead the model is built on the meta device
from its config, placed (under FSDP2: sharded, each rank allocating only its shards; see
hanlm.train.parallel.parallelize_loaded) and then filled here, each rank reading only what it
keeps:

* safetensors: each tensor through `safe_open(...).get_slice`, the rows of this rank's shard
  (the file is memory-mapped; a replicated model reads every row);
* a DCP checkpoint: `dcp.load` into the placed model's own state dict, whose DTensors make
  DCP read only this rank's shards (the resharding that resume uses).

The values are what `transformers.from_pretrained` (dtype "auto") and then `.float()` give:
a tensor is read in the dtype the folder's config names (else the file's own) and widened to
the model's float32. Tied tensors are one parameter, read once. A source whose tensors do not
match the model built from its config (names, shapes, mixed dtypes) is reported by
`mismatch`; the caller then loads it the old way, whole.

The special-token audit reads only the token matrices (`with_token_matrices`), never the rest.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from hanlm.chat.tokens import local_block, matrices
from hanlm.errors import UserError
from hanlm.model_folder import WEIGHTS, WEIGHTS_INDEX
from hanlm.train.export import checkpoint_tensor_shapes

# --- what the source holds ----------------------------------------------------------------------


def _safetensors_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (one file, or the index's shards)."""
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    with safe_open(str(folder / WEIGHTS), "pt") as f:
        return dict.fromkeys(f.keys(), folder / WEIGHTS)


def _saved_shapes(kind: str, path: Path) -> dict[str, tuple[int, ...] | None]:
    """Tensor name -> full shape, for a folder ("hf") or a checkpoint ("checkpoint")."""
    if kind == "checkpoint":
        return checkpoint_tensor_shapes(path)
    shapes: dict[str, tuple[int, ...] | None] = {}
    files = _safetensors_files(path)
    for file in sorted(set(files.values())):
        with safe_open(str(file), "pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            for name in names:
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _saved_dtypes(path: Path) -> set[str]:
    dtypes = set()
    for file in sorted(set(_safetensors_files(path).values())):
        with safe_open(str(file), "pt") as f:
            names = f.keys()
            dtypes |= {f.get_slice(name).get_dtype() for name in names}
    return dtypes


def parameter_names(model: torch.nn.Module) -> dict[str, list[str]]:
    """Each parameter's first name -> all its names (a tied head shares the embedding's)."""
    by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(param), []).append(name)
    return {names[0]: names for names in by_param.values()}


def _source_names(model: torch.nn.Module, saved: dict) -> dict[str, str]:
    """Each parameter's first name -> the name the source holds it under."""
    return {
        first: next(n for n in names if n in saved)
        for first, names in parameter_names(model).items()
        if any(n in saved for n in names)
    }


def mismatch(model: torch.nn.Module, kind: str, path: Path) -> str | None:
    """Why the source's tensors cannot be read into `model` (built from its config, on any
    device, meta included) by name and shape; None when they can."""
    saved = _saved_shapes(kind, path)
    names = parameter_names(model)
    found = _source_names(model, saved)
    for first, all_names in names.items():
        if first not in found:
            return f"it has no tensor {first}"
        held = [n for n in all_names if n in saved]
        if len(held) > 1 and kind == "hf":  # which copy from_pretrained keeps is its business
            return f"it holds the tied tensors {', '.join(held)} separately"
        shape = tuple(model.get_parameter(first).shape)
        if saved[found[first]] != shape:
            return f"its {found[first]} has shape {saved[found[first]]}, the model's {shape}"
    known = {n for all_names in names.values() for n in all_names}
    extra = sorted(set(saved) - known)
    if extra:
        return f"it holds tensors the model lacks ({', '.join(extra[:3])})"
    if kind == "hf" and getattr(model.config, "dtype", None) is None:
        dtypes = _saved_dtypes(path)
        if len(dtypes) > 1:  # from_pretrained would cast all to the first it meets
            return f"its tensors have several dtypes ({', '.join(sorted(dtypes))})"
    return None


# --- reading into a placed model ----------------------------------------------------------------


def fill(model: torch.nn.Module, kind: str, path: Path) -> None:
    """Write every parameter of the placed `model` (plain, or FSDP2-sharded on dim 0) from the
    source; each rank reads and writes only its own rows. Call `mismatch` first."""
    if kind == "checkpoint":
        _fill_from_checkpoint(model, path)
    else:
        _fill_from_safetensors(model, path)


def _load_dtype(model: torch.nn.Module) -> torch.dtype | None:
    dtype = getattr(model.config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


@torch.no_grad()
def _fill_from_safetensors(model: torch.nn.Module, folder: Path) -> None:
    files = _safetensors_files(folder)
    found = _source_names(model, files)
    dtype = _load_dtype(model)
    for first, name in found.items():
        target, start = local_block(model.get_parameter(first))
        # opened per tensor: the file is memory-mapped, and the pages read stay in this
        # process's resident memory until it is closed
        with safe_open(str(files[name]), "pt") as f:
            tensor = f.get_slice(name)
            piece = tensor[start : start + target.shape[0]] if target.dim() else tensor[:]
        target.copy_(piece if dtype is None else piece.to(dtype))


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    # DCP warns that it "assumes" a single process when there is no process group: we mean it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _fill_from_checkpoint(model: torch.nn.Module, checkpoint_dir: Path) -> None:
    state = get_model_state_dict(model)
    saved = _saved_shapes("checkpoint", checkpoint_dir)
    # A tied tensor is read once into the model; a second copy the checkpoint holds (the
    # trainer saves both names) into scratch of the same sharding, to check the tie.
    request, aliases = {}, {}
    for all_names in parameter_names(model).values():
        held = [n for n in all_names if n in saved]
        request[held[0]] = state[held[0]]
        for alias in held[1:]:
            request[alias] = torch.empty_like(state[held[0]])
            aliases[alias] = held[0]
    alone = not dist.is_initialized()
    with _quiet_single_process():
        dcp.load({"model": request}, checkpoint_id=str(checkpoint_dir), no_dist=alone)
    untied = [a for a, primary in aliases.items() if not _equal(request[a], request[primary])]
    if not alone:  # every rank compared its own shard: all must agree
        flag = torch.tensor([float(bool(untied))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        untied = untied or (["a tied tensor"] if flag.item() else [])
    if untied:
        raise UserError(
            f"the checkpoint's {untied[0]} differs from the tensor the model ties it to",
            where=str(checkpoint_dir),
            fix="start SFT with the model config the run was pretrained with (model.preset)",
        )
    for alias in aliases:
        del request[alias]
    set_model_state_dict(model, request, options=StateDictOptions(strict=False))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    local = (lambda t: t.to_local()) if hasattr(a, "to_local") else (lambda t: t)
    return torch.equal(local(a), local(b))


# --- the token matrices alone -------------------------------------------------------------------


@torch.no_grad()
def with_token_matrices(model: torch.nn.Module, kind: str, path: Path) -> torch.nn.Module:
    """`model` (built on meta, `mismatch` None) with its input embedding and output head read
    whole onto the CPU, everything else left on meta: what the special-token audit reads."""
    names = parameter_names(model)
    first_of = {id(p): n for n, p in model.named_parameters()}
    found = _source_names(model, _saved_shapes(kind, path))
    requests = {}
    for weight in matrices(model).values():
        first = first_of[id(weight)]
        value = torch.empty(weight.shape, dtype=weight.dtype, device="cpu")
        requests[found[first]] = value
        parameter = torch.nn.Parameter(value, requires_grad=weight.requires_grad)
        for name in names[first]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, parameter)
    if kind == "checkpoint":
        with _quiet_single_process():  # every rank reads them whole, alone
            dcp.load({"model": requests}, checkpoint_id=str(path), no_dist=True)
        return model
    files, dtype = _safetensors_files(path), _load_dtype(model)
    for name, value in requests.items():
        with safe_open(str(files[name]), "pt") as f:
            tensor = f.get_tensor(name)
        value.copy_(tensor if dtype is None else tensor.to(dtype))
    return model
