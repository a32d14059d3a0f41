"""A model built on the meta device, then given exactly the weights `build_model(seed)` gives.

Building a 1.3B model in full on every rank only to shard it costs each rank the whole model in
memory. Built on the meta device instead, nothing is allocated; FSDP shards that empty model and
each rank then fills only its shards. The weights must still be the seeded eager build's, bit
for bit: transformers draws them from the global generator, module after module (the layers'
own constructors first, then `_init_weights`), so the value of any one parameter depends on
every draw before it.

So the meta build runs the very same construction and initialisation code, with transformers'
"skip init on meta" switch turned off, under a dispatch mode that records every in-place op on
a meta tensor (uniform_, normal_, fill_, ...) and every constant factory (ones, zeros, full).
`MetaInit.replay` then reruns that record in order with the same seeded generator on the real
device: a draw whose values are later overwritten (a Linear's default kaiming init, a head
tied away) is made into a scratch tensor and dropped, which advances the generator exactly as
the eager build did; a parameter's live ops run on one full tensor that is handed to `store`
(which keeps a rank's shard) and freed. The peak is about one full parameter.

Non-persistent buffers (RoPE's `inv_freq`) are recomputed by transformers' own `_init_weights`
on the module that owns them, as the eager build did last. A model whose initialisation cannot
be replayed this way (a parameter made by arithmetic rather than by an init op, a draw from
its own generator) gets `MetaInit.unsupported` with the reason; callers build it eagerly then.

A model whose weights come from a file instead (SFT's pretrained model) uses the same parts:
`allocate` (storage on the device, ties kept) and `recompute_buffers`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import transformers.modeling_utils
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hanlm.model import _seeded_rng, build_model

if TYPE_CHECKING:
    from transformers import PretrainedConfig

aten = torch.ops.aten

# Factories whose whole output is one constant: recorded as a fill_ of their storage.
_CONSTANT_FACTORIES = {
    aten.ones.default: lambda args, kwargs: 1,
    aten.zeros.default: lambda args, kwargs: 0,
    aten.full.default: lambda args, kwargs: args[1],
}


@dataclass(frozen=True)
class _Write:
    """One in-place op on (a view of) one storage, as the build ran it."""

    storage: int  # the storage's identity (its StorageImpl address, kept alive while recording)
    storage_numel: int
    dtype: torch.dtype
    view: tuple[tuple[int, ...], tuple[int, ...], int]  # size, stride, storage offset
    op: Any  # an aten OpOverload writing its first argument
    args: tuple  # the op's other arguments; empty when `replayable` is False
    kwargs: dict
    random: bool  # draws from the generator
    replayable: bool  # no tensor or generator among the arguments

    @property
    def covers_storage(self) -> bool:
        size, stride, offset = self.view
        return (
            offset == 0
            and math.prod(size) == self.storage_numel
            and stride == _contiguous_strides(size)
        )

    @property
    def overwrites(self) -> bool:
        """The result does not depend on what the storage held before."""
        return self.replayable and self.covers_storage and (self.random or self.op in _FILLS)

    def run_on(self, flat: torch.Tensor) -> None:
        size, stride, offset = self.view
        self.op(flat.as_strided(size, stride, offset), *self.args, **self.kwargs)


_FILLS = (aten.fill_.Scalar, aten.zero_.default)


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _Recorder(TorchDispatchMode):
    """Notes every write to a meta tensor, in order; keeps the tensors alive so that a storage's
    address names one storage for the whole build."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[_Write] = []
        self.problems: list[str] = []
        self._alive: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        first = args[0] if args else None
        if _writes_first_argument(func) and isinstance(first, torch.Tensor) and first.is_meta:
            self._note(func, first, args[1:], kwargs)
        elif func in _CONSTANT_FACTORIES and isinstance(out, torch.Tensor) and out.is_meta:
            value = _CONSTANT_FACTORIES[func](args, kwargs)
            self._note(aten.fill_.Scalar, out, (value,), {})
        elif torch.Tag.nondeterministic_seeded in func.tags:
            self.problems.append(f"the build draws a new random tensor with {func}")
        return out

    def _note(self, op, target: torch.Tensor, args: tuple, kwargs: dict) -> None:
        leaves, _ = tree_flatten((args, kwargs))
        replayable = not any(isinstance(x, torch.Tensor | torch.Generator) for x in leaves)
        self._alive.append(target)
        self.writes.append(
            _Write(
                storage=_storage_key(target),
                storage_numel=target.untyped_storage().nbytes() // target.element_size(),
                dtype=target.dtype,
                view=(tuple(target.shape), tuple(target.stride()), target.storage_offset()),
                op=op,
                args=tuple(args) if replayable else (),
                kwargs=dict(kwargs) if replayable else {},
                random=torch.Tag.nondeterministic_seeded in op.tags,
                replayable=replayable,
            )
        )


def _writes_first_argument(func) -> bool:
    arguments = func._schema.arguments
    return (
        bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
    )


@contextlib.contextmanager
def _initialising_on_meta() -> Iterator[None]:
    """transformers skips `_init_weights` when it builds on the meta device (nothing to fill);
    here its draws are what is recorded, so it must run. No public switch does this:
    `initialize_weights()` called after the build runs after `tie_weights`, so a tied head would
    be drawn over the embedding in another order than a CPU build draws them, and the replay
    would no longer equal that build. post_init asks this one function whether a meta context
    is active; answering None for the build is the narrowest change."""
    name = "get_torch_context_manager_or_global_device"
    if not hasattr(transformers.modeling_utils, name):  # an older transformers: always inits
        yield
        return
    original = getattr(transformers.modeling_utils, name)
    setattr(transformers.modeling_utils, name, lambda: None)
    try:
        yield
    finally:
        setattr(transformers.modeling_utils, name, original)


# --- the replay -----------------------------------------------------------------------------------

_DRAW, _APPLY = "draw", "apply"  # a draw into scratch (values dropped); an op on a live parameter


@dataclass(frozen=True)
class _Step:
    kind: str
    write: _Write
    store_as: str | None = None  # after this step the parameter's value is final: store it


@dataclass
class MetaInit:
    """How to give a meta-built model its seeded eager weights (see the module docstring)."""

    steps: list[_Step] = field(default_factory=list)
    shapes: dict[str, torch.Size] = field(default_factory=dict)  # parameter name -> shape
    buffer_owners: list[str] = field(default_factory=list)  # modules whose buffers to recompute
    unsupported: str | None = None  # why the record cannot be replayed; then build eagerly

    def replay(
        self,
        seed: int,
        device: torch.device | str,
        store: Callable[[str, torch.Tensor], None],
    ) -> None:
        """Rerun the build's initialisation on `device` with `seed`, calling `store(name, value)`
        once per parameter with its full value (freed once `store` returns)."""
        if self.unsupported:
            raise RuntimeError(
                f"this model's initialisation cannot be replayed: {self.unsupported}"
            )
        device = torch.device(device)
        live: dict[int, torch.Tensor] = {}
        with _seeded_rng(seed, device), torch.no_grad():
            for step in self.steps:
                write = step.write
                if step.kind == _DRAW:
                    write.run_on(torch.empty(write.storage_numel, dtype=write.dtype, device=device))
                else:
                    if write.storage not in live:
                        live[write.storage] = torch.empty(
                            write.storage_numel, dtype=write.dtype, device=device
                        )
                    write.run_on(live[write.storage])
                if step.store_as is not None:
                    store(step.store_as, live.pop(write.storage).view(self.shapes[step.store_as]))

    def recompute_buffers(self, model: torch.nn.Module, device: torch.device | str) -> None:
        """Fill the buffers left empty by `to_empty` (RoPE frequencies) as the eager build did."""
        recompute_buffers(model, self.buffer_owners, device)


def recompute_buffers(
    model: torch.nn.Module, owners: list[str], device: torch.device | str
) -> None:
    """Fill the buffers of the modules `owners` names (left empty by `to_empty`) as the build
    does: with transformers' `_init_weights` of the model part owning each, on `device`."""
    init_owners = _init_weights_owners(model)
    with torch.no_grad(), torch.device(device):
        for name in owners:
            init_owners[name]._init_weights(model.get_submodule(name))


def buffer_owners(model: torch.nn.Module) -> list[str]:
    """The modules whose buffers `recompute_buffers` can fill for a model whose weights come
    from elsewhere (a pretrained one); ValueError saying why when a buffer cannot be."""
    owners, problem = _buffer_owners(model, None)
    if problem:
        raise ValueError(problem)
    return owners


def materialise(
    model: torch.nn.Module,
    init: MetaInit,
    *,
    seed: int,
    device: torch.device | str,
    store: Callable[[torch.nn.Parameter, torch.Tensor], None] | None = None,
    root: torch.nn.Module | None = None,
) -> None:
    """Allocate `model` (built on meta, maybe sharded since) on `device` and give it the
    weights of `build_model(seed=seed)`; `store(parameter, full value)` writes one parameter
    (default: copies the whole value; a sharded model keeps its shard). `root`: the module
    holding `model` that FSDP2 sharded, when not `model` itself (allocation runs on it, so
    that FSDP2 registers the new shards)."""
    allocate(model, device, root=root)
    write = store or (lambda param, value: param.copy_(value))
    init.replay(seed, device, lambda name, value: write(model.get_parameter(name), value))
    init.recompute_buffers(model, device)


def allocate(
    model: torch.nn.Module, device: torch.device | str, *, root: torch.nn.Module | None = None
) -> None:
    """Give a model built on meta (maybe sharded since) uninitialised storage on `device`, its
    tied parameters still one parameter. `root`: as in `materialise`."""
    ties = _tied_names(model)
    (root if root is not None else model).to_empty(device=device)
    for names in ties:  # to_empty gives each module its own new parameter
        shared = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, shared)


def _tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Names of each parameter that more than one module holds, e.g. a tied output head."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _init_weights_owners(model: torch.nn.Module) -> dict[str, Any]:
    """Module name -> the innermost transformers PreTrainedModel containing it (whose
    `_init_weights` initialised it, as transformers' smart_apply dispatches)."""
    owners: dict[str, Any] = {}

    def walk(module: torch.nn.Module, prefix: str, owner) -> None:
        if isinstance(module, transformers.PreTrainedModel):
            owner = module
        owners[prefix] = owner
        for name, child in module.named_children():
            walk(child, f"{prefix}.{name}" if prefix else name, owner)

    walk(model, "", None)
    return owners


def plan_replay(model: torch.nn.Module, writes: list[_Write], problems: list[str]) -> MetaInit:
    """The steps that rebuild `model`'s parameters from the build's `writes`, or why not."""
    if problems:
        return MetaInit(unsupported=problems[0])
    params: dict[int, str] = {}
    shapes: dict[str, torch.Size] = {}
    for name, p in model.named_parameters():
        if p.storage_offset() or not p.is_contiguous() or p.numel() != _storage_numel(p):
            return MetaInit(unsupported=f"parameter {name} is a view of a larger tensor")
        params[_storage_key(p)] = name
        shapes[name] = p.shape
    last_overwrite: dict[int, int] = {}
    last_write: dict[int, int] = {}
    written_whole: set[int] = set()
    for i, w in enumerate(writes):
        last_write[w.storage] = i
        if w.overwrites:
            last_overwrite[w.storage] = i
        if w.covers_storage:
            written_whole.add(w.storage)
    for storage, name in params.items():
        if storage not in last_overwrite:
            opaque = [w.op for w in writes if w.storage == storage and not w.replayable]
            if opaque:
                return MetaInit(unsupported=_opaque(name, opaque[-1]))
            return MetaInit(
                unsupported=f"parameter {name} gets its value otherwise than by an init op "
                "(uniform_, normal_, fill_, ...)"
            )
    steps: list[_Step] = []
    for i, w in enumerate(writes):
        name = params.get(w.storage)
        if name is not None and i >= last_overwrite[w.storage]:
            if not w.replayable:
                return MetaInit(unsupported=_opaque(name, w.op))
            store_as = name if i == last_write[w.storage] else None
            steps.append(_Step(_APPLY, w, store_as))
        elif w.random:  # values overwritten or dropped, but the draw advances the generator
            if not w.replayable:
                return MetaInit(unsupported=f"{w.op} draws with tensor or generator arguments")
            steps.append(_Step(_DRAW, w))
    owners, problem = _buffer_owners(model, written_whole)
    if problem:
        return MetaInit(unsupported=problem)
    return MetaInit(steps=steps, shapes=shapes, buffer_owners=owners)


def _opaque(name: str, op) -> str:
    return f"parameter {name} is written by {op} with tensor or generator arguments"


def _buffer_owners(model: torch.nn.Module, written_whole: set[int] | None) -> tuple[list[str], str]:
    """The modules whose buffers `recompute_buffers` fills, or why it cannot. `written_whole`:
    the storages the recorded build wrote whole (None: nothing recorded, not checked)."""
    init_owners = _init_weights_owners(model)
    owners: list[str] = []
    for module_name, module in model.named_modules():
        buffers = [(n, b) for n, b in module.named_buffers(recurse=False) if b is not None]
        if not buffers:
            continue
        where = f"module {module_name or type(module).__name__}"
        if init_owners.get(module_name) is None:
            return [], f"{where} has buffers but no transformers _init_weights to set them"
        if any(True for _ in module.parameters(recurse=False)):
            return [], f"{where} has both parameters and buffers"
        for name, buffer in buffers:
            # Written whole during the build's init: `_init_weights` recomputes it.
            if written_whole is not None and _storage_key(buffer) not in written_whole:
                return [], f"buffer {name} of {where} is not set by the model's _init_weights"
        owners.append(module_name)
    return owners, ""


def _storage_numel(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def build_on_meta(
    config: PretrainedConfig, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, MetaInit]:
    """(the model `build_model(config, dtype=dtype)` builds, on the meta device; how to give
    it that build's weights for any seed)."""
    recorder = _Recorder()
    with _initialising_on_meta(), recorder:
        model = build_model(config, dtype=dtype, device="meta")
    return model, plan_replay(model, recorder.writes, recorder.problems)


def record_build(build: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, MetaInit]:
    """`build()` run on the meta device and recorded: for modules other than transformers'."""
    recorder = _Recorder()
    with _initialising_on_meta(), recorder, torch.device("meta"):
        model = build()
    return model, plan_replay(model, recorder.writes, recorder.problems)
