"""Processes and devices, and wrapping a model for them: single process, DDP or FSDP2.

The model code knows nothing of this: `parallelize` takes a plain transformers model and applies,
in torchtitan's order, activation checkpointing, per-block torch.compile, then DDP or FSDP2
(`fully_shard` per decoder layer and at the root). The root is the model ending in its loss
(hanlm.train.loss.CausalLMWithLoss), so the output head is used inside the root's forward.
Launch several processes with torchrun (one host or several, c10d rendezvous); gloo on CPU,
NCCL on GPU. Every rank learns at start who and where the others are (peers.py), so that a lost
peer can be named when a collective fails.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as torch_dist

from hanlm import model_init, ranks
from hanlm.errors import UserError
from hanlm.inference import resolve_device
from hanlm.model import enable_activation_checkpointing
from hanlm.train import peers, threads
from hanlm.train.loss import CausalLMWithLoss


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    roster: tuple[peers.Peer, ...] = field(default=(), compare=False)  # every rank, by rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _pick_device(preference: str, local_rank: int) -> torch.device:
    """This process's device by hanlm.inference's rule; `cuda` is the local rank's GPU."""
    device = resolve_device(preference, setting="parallel.device", local_rank=local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


_groups_joined = 0  # process groups this process has joined (a pipeline joins one per stage)


def _own_store(timeout: datetime.timedelta):
    """Under torchrun, the agent's store with keys of this process group's own, or None.

    A process that joins again after leaving (preflight, then pretraining, then SFT in one
    `hanlm run`) would otherwise meet the first group's keys in torchrun's store (torch numbers
    the default group from 0 again after destroy_process_group) and connect to addresses
    nobody listens at any more. Every rank joins the same groups in the same order, so a count
    names them alike on all ranks."""
    global _groups_joined
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    _groups_joined += 1
    store = torch_dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return torch_dist.PrefixStore(f"hanlm/group-{_groups_joined}", store)


def init(device: str = "auto", timeout_s: float = 600.0) -> Dist:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else run alone.
    A collective that waits longer than `timeout_s` for a peer fails."""
    world_size = ranks.world_size()
    rank = ranks.rank()
    local_rank = ranks.local_rank()
    dev = _pick_device(device, local_rank)
    if world_size > 1 and not torch_dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            store = _own_store(timeout)
            joined = {} if store is None else {"store": store, "rank": rank}
            torch_dist.init_process_group(
                backend,
                timeout=timeout,
                device_id=dev if dev.type == "cuda" else None,
                world_size=world_size,
                **joined,
            )
        except Exception as e:  # the rendezvous failed: a peer or the address is wrong
            address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
            raise UserError(
                f"could not join the process group at {address} ({type(e).__name__}: {e})",
                fix="check that every host runs the same torchrun command with the same "
                "--rdzv-endpoint and that the port is open (hanlm preflight checks this)",
            ) from None
    roster = peers.exchange(rank, world_size) if world_size > 1 else ()
    # A fixed CPU thread count, whatever the load: the same config gives the same bits.
    threads.pin()
    return Dist(rank, world_size, local_rank, dev, roster)


def shutdown(dist: Dist) -> None:
    if dist.distributed and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    peers.close()


def lost_peers(dist: Dist, error: BaseException) -> peers.PeerLost | None:
    """The error to report instead of `error` when it came from peers that are gone."""
    return peers.explain(error, dist.roster, dist.rank) if dist.distributed else None


def planned_placement(device: str, mode: str) -> tuple[torch.device, str]:
    """The device and parallel mode this process will train with, known before any process
    group is joined (what `hanlm run` checks before its first stage)."""
    world_size = ranks.world_size()
    local_rank = ranks.local_rank()
    dev = resolve_device(device, setting="parallel.device", local_rank=local_rank)
    return dev, resolve_mode(mode, Dist(0, world_size, local_rank, dev))


def resolve_mode(mode: str, dist: Dist) -> str:
    if mode == "auto":
        return "fsdp" if dist.distributed else "single"
    if mode in ("ddp", "fsdp") and not dist.distributed:
        return "single"  # one process: there is nothing to shard or synchronise
    if mode == "single" and dist.distributed:
        raise UserError(
            f"parallel.mode is single but torchrun started {dist.world_size} processes",
            fix="use --parallel ddp or fsdp, or run without torchrun",
        )
    return mode


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a transformers causal LM."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise UserError(
            f"cannot find the decoder layers of {type(model).__name__}",
            fix="use a Llama-family model or a preset",
        )
    return list(layers)


def parallelize(
    model: torch.nn.Module,
    dist: Dist,
    mode: str,
    *,
    compute_dtype: torch.dtype = torch.float32,
    activation_checkpointing: bool | str = False,
    compile_blocks: bool = False,
) -> torch.nn.Module:
    """Apply activation checkpointing, per-block compile and DDP/FSDP2, in that order; the result
    ends in the loss (its forward takes labels and a loss function) and `unwrap` gives the model."""
    if activation_checkpointing not in (False, "none"):
        enable_activation_checkpointing(
            model, "full" if activation_checkpointing is True else activation_checkpointing
        )
    if compile_blocks:
        for layer in decoder_layers(model):
            layer.compile()
    root = CausalLMWithLoss(model)  # the module DDP and FSDP2 wrap
    if mode == "ddp":
        # deferred: DDP and FSDP2 are needed only under torchrun
        from torch.nn.parallel import DistributedDataParallel

        ids = [dist.device.index] if dist.device.type == "cuda" else None
        # Gradients live in the reducer's buckets: no second copy of them (4 bytes a parameter).
        return DistributedDataParallel(root, device_ids=ids, gradient_as_bucket_view=True)
    if mode == "fsdp":
        # deferred: see DDP above
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(dist.device.type, (dist.world_size,))
        # Parameters gathered in the compute dtype; gradients reduced in fp32 for stability.
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(root, mesh=mesh, mp_policy=mp)
    return root


def parallelize_loaded(
    model: torch.nn.Module,
    dist: Dist,
    mode: str,
    *,
    fill: Callable[[torch.nn.Module], None],
    compute_dtype: torch.dtype = torch.float32,
    compile_blocks: bool = False,
    convert: Callable[[torch.nn.Module], None] | None = None,
    activation_checkpointing: bool | str = False,
) -> torch.nn.Module:
    """`parallelize` for a model whose weights come from elsewhere (SFT's pretrained model),
    built on the meta device: it is placed first (under FSDP2 sharded, each rank allocating
    only its shards on the device) and `fill(model)` then writes its parameters, each rank
    those it holds (hanlm.train.pretrained); buffers (RoPE's) are computed as the build computes
    them. `convert` swaps modules in place (FP8's Float8Linear keeps the parameter names and
    shapes): before sharding under FSDP2, else once the weights are in."""
    owners = model_init.buffer_owners(model)  # ValueError: a buffer the build cannot redo
    options = {
        "compute_dtype": compute_dtype,
        "compile_blocks": compile_blocks,
        "activation_checkpointing": activation_checkpointing,
    }
    if mode == "fsdp":
        if convert is not None:
            convert(model)
        root = parallelize(model, dist, mode, **options)
        model_init.allocate(model, dist.device, root=root)
        model_init.recompute_buffers(model, owners, dist.device)
        with torch.no_grad():
            fill(model)
        return root
    model_init.allocate(model, dist.device)
    model_init.recompute_buffers(model, owners, dist.device)
    with torch.no_grad():
        fill(model)
    if convert is not None:
        convert(model)
    return parallelize(model, dist, mode, **options)


def parallelize_whole(
    model: torch.nn.Module,
    dist: Dist,
    mode: str,
    *,
    compute_dtype: torch.dtype = torch.float32,
    compile_blocks: bool = False,
    convert: Callable[[torch.nn.Module], None] | None = None,
    activation_checkpointing: bool | str = False,
) -> torch.nn.Module:
    """`parallelize` for a model loaded whole on the host: moved to the device whole, then
    converted and parallelized (FSDP2 shards it there)."""
    model = model.to(dist.device)
    if convert is not None:
        convert(model)
    return parallelize(
        model, dist, mode, compute_dtype=compute_dtype, compile_blocks=compile_blocks,
        activation_checkpointing=activation_checkpointing,
    )  # fmt: skip


def write_full_value(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Copy a parameter's full value into it; a sharded (DTensor) parameter keeps only this
    rank's shard of it, cut locally (every rank holds the same full value, nothing is sent)."""
    # deferred: as DDP and FSDP2 in parallelize, needed only under torchrun
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        value = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(value)


def no_sync(model: torch.nn.Module, mode: str, last_micro_step: bool):
    """DDP: skip the gradient all-reduce on all but the last micro-step of an accumulation.

    FSDP2 keeps reduce-scattering every micro-step: holding unsharded gradients across the
    accumulation would give back the memory that sharding saved.
    """
    if mode == "ddp" and not last_micro_step:
        return model.no_sync()
    return contextlib.nullcontext()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM inside DDP and CausalLMWithLoss."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def all_reduce_sum(values: torch.Tensor, dist: Dist) -> torch.Tensor:
    if dist.distributed:
        torch_dist.all_reduce(values, op=torch_dist.ReduceOp.SUM)
    return values


def barrier(dist: Dist) -> None:
    if dist.distributed:
        torch_dist.barrier()
