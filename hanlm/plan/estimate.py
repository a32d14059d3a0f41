"""`hanlm plan`: will it fit, how long, how much, before any GPU is rented.

Memory per GPU is counted the way hanlm trains (float32 master weights, gradients and AdamW
states; bf16/FP8 compute under autocast or FSDP2's bf16 parameters):

- model state: each parameter tensor's bytes, exactly, from the model built on the meta device;
  FSDP2 gives each rank ceil(dim0 / ranks) rows of every tensor. LoRA SFT: gradients and
  AdamW states for the adapters and the trained rows only; below fp32 the blocks' frozen linear
  layers are held in the compute dtype, so autocast casts none of them.
- working copies: the weights the compute reads beside the float32 masters: autocast's bf16
  casts of every matmul weight (single process and DDP), or FSDP2's unsharded parameters, in
  the compute dtype, fp32 included: two decoder layers' worth (the layer computing, and in
  forward its flat all-gather buffer, kept until the next layer's copy-out; in backward the
  next layer, prefetched) and the root's (embedding, untied head, final norm), which stay
  unsharded from forward to backward.
- FSDP2's gradient buffers: a layer's backward makes its full-size (unsharded) gradients in the
  compute dtype, which FSDP2 copies into a full-size float32 reduce-scatter input before freeing
  them; at most one such input is kept while the next layer's backward runs (the default
  `reduce_scatter_max_input_buffers` of 1; torch.distributed.fsdp._fully_shard). The root's
  unsharded head gradient is the loss's (below).
- activations: the bytes autograd saves per token of a decoder layer, counted from the tensors
  a Llama layer saves (see `_layer_activation_bytes`); `hanlm.train.memtrace` observes the same step
  on fake tensors and the tests hold the two within a few percent.
- loss: hanlm computes it a chunk of tokens at a time (hanlm.train.loss): the gradients of the
  final hidden states and of the output head that the forward keeps for backward, one chunk's
  float32 logits with their log-softmax and gradients, and the head's gradient being summed.
  (Before, the whole micro-batch's logits and their float32 log-softmax and gradient.)
- checkpoint staging, on a CPU only (there the device memory is the host's): an asynchronous
  save copies the rank's weights and AdamW state to host memory (DCP's stager) and holds the
  copy while the next steps run. A GPU's plan leaves it out: it is host RAM, not the GPU's.
- framework: a stated allowance for the CUDA context, cuBLAS/NCCL workspaces and allocator
  fragmentation (FRAMEWORK_GIB + FRAGMENTATION of the rest); on a CPU the runtime instead
  (CPU_RUNTIME_GIB: the interpreter with torch and transformers, measured 0.40 GiB a rank by
  benchmarks/rehearsal_350m.py).

Time: FLOPs per token (6·N by the field report's rule, or hanlm's exact count with attention)
times tokens, at a model FLOPs utilisation (MFU) per GPU class, plus the communication that
compute does not hide. Cost: GPU-hours times the hourly price.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from hanlm.errors import UserError
from hanlm.plan.catalogue import CATALOGUE, find, measured_cpu_peak_flops
from hanlm.plan.data_rates import DataWork, data_time, data_work, mixture_preview
from hanlm.results import Part, Result

GIB = 1 << 30
FRAMEWORK_GIB = 1.5  # CUDA context (~0.5 GiB), cuBLAS/NCCL workspaces, kernels
CPU_RUNTIME_GIB = 0.5  # a CPU rank's interpreter, torch, transformers, process group
FRAGMENTATION = 0.05  # the caching allocator's unusable share of what it holds
COMM_OVERLAP = 0.8  # share of compute time that can hide communication (bucketed, prefetched)
RECOMPUTE_COST = {"none": 1.0, "selective": 1.05, "full": 4 / 3}  # forward run again
RECOMPUTE_MODES = tuple(RECOMPUTE_COST)
PARALLEL_MODES = ("single", "ddp", "fsdp")
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp8": 2}  # activation dtype; FP8 saves bf16 inputs
PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp8": 2}  # FSDP2's gathered parameters and their gradients
# The token budget is the recipe's whatever the optimizer: a token-efficiency factor is applied
# only where one was measured at the scale planned, and none is (benchmarks/README.md, optimizer).
MUON_TOKENS_NOTE = (
    "Muon: the tokens as given, no token-efficiency factor (benchmarks/optimizer.py measured "
    "only 1-4M-parameter models; Wen et al. 2025 found ~1.1x at 1.2B)"
)
OPTIMIZER_ITEM = {
    "adamw": "optimizer (AdamW m, v)",
    "muon": "optimizer (Muon momentum; AdamW m, v)",
}
DEFAULT_INTER_HOST_GBPS = 25.0  # a rented host's Ethernet, Gbit/s
DEFAULT_LOSS_CHUNK_TOKENS = 1024  # [parallel] loss_chunk_tokens (hanlm.train.loss)

# Realistic bf16 MFU by class (of the dense BF16 peak): NVLink boards with mature kernels reach
# 40-50%; consumer and PCIe cards lose more to host overhead and slower links. (hanlm measured 54%
# for `1.3b` and 42% for `350m` on one H200, compiled, seq 2,048 x 16: benchmarks/gpu_train.py;
# the planning figures stay below that for several GPUs.) FP8 GEMMs run at twice the bf16 rate but
# the rest of the step does not: torchtitan reports ~1.3-1.5x end to end on H100 for 8B models;
# hanlm measured 1.18x at `1.3b` and 1.01x at `350m` on one H200, whose matmuls are smaller. The
# FP8 default is 0.6x the bf16 MFU against the FP8 peak (1.2x the bf16 tokens/s).
DEFAULT_BF16_MFU = {
    "rtx4090": 0.35,
    "rtx5090": 0.40,  # the field report's planning figure
    "l40s": 0.35,
    "a100-40gb": 0.45,
    "a100-80gb": 0.45,
    "h100": 0.40,
    "h200": 0.40,
    "b200": 0.35,
}
FP8_MFU_FACTOR = 0.6
CPU_MFU = 0.5  # against the measured matmul peak of this CPU


@dataclass(frozen=True)
class LoraPlan:
    """LoRA's trained parameters (hanlm.train.lora): rank-r adapters on the named linear layers
    of every block, and `token_rows` embedding rows (PEFT's trainable_token_indices)."""

    rank: int
    targets: tuple[str, ...]
    token_rows: int = 0


@dataclass(frozen=True)
class Setup:
    """One training configuration to plan: model, batch, hardware, precision and parallelism."""

    model: str  # preset or path of a config.json
    vocab_size: int
    seq_len: int
    micro_batch: int
    gpu: str | None  # catalogue key, "cpu", or None: no hardware chosen
    gpus: int = 1  # per host
    hosts: int = 1
    precision: str = "bf16"
    parallel: str = "fsdp"
    recompute: str = "none"
    compiled: bool = False  # parallel.compile: inductor saves less for backward than eager
    optimizer: str = "adamw"  # optimizer.name: "muon" keeps one buffer for the blocks' matrices
    tokens: float | None = None
    global_batch_tokens: int | None = None
    price_per_gpu_hour: float | None = None
    mfu: float | None = None
    inter_host_gbps: float = DEFAULT_INTER_HOST_GBPS
    data: DataWork | None = None  # the data stages' work (hanlm.plan.data_rates)
    loss_chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS
    async_checkpoint: bool = True  # [checkpoint] async_save: a host copy staged per save
    lora: LoraPlan | None = None  # SFT with LoRA: only the adapters (and chosen rows) train

    @property
    def world(self) -> int:
        return self.gpus * self.hosts

    @property
    def sharded(self) -> bool:
        """FSDP2 over more than one rank."""
        return self.parallel == "fsdp" and self.world > 1


# The field report's setup: a 1.35B model with a 65,536-token vocabulary, 2,048-token sequences,
# bf16 with AdamW, on one RTX 5090; 22B tokens at 40% MFU and 0.40 USD per GPU-hour. The report
# card and the tests compare it with 8 GPUs under FSDP.
FIELD_REPORT = Setup(
    model="1.3b",
    vocab_size=65536,
    seq_len=2048,
    micro_batch=2,
    gpu="rtx5090",
    precision="bf16",
    parallel="single",
    tokens=22e9,
    global_batch_tokens=1 << 20,
    price_per_gpu_hour=0.40,
    mfu=0.40,
)


# --- the model's shapes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    params: list[tuple[int, ...]]  # every parameter tensor's shape, shared ones once
    layer_params: int  # one decoder layer's parameters
    root_params: int  # the rest, FSDP2's root: embedding, untied head, final norm
    matmul_weights: int  # weights a token's matmuls read, the output projection included
    embedding: int  # the input embedding's parameters (FSDP2's root holds it whole)
    hidden: int
    query_width: int
    kv_width: int
    ffn: int
    heads: int
    head_dim: int
    layers: int
    vocab: int
    n_params: int
    flops: dict[str, int]
    # a block's linear layer name -> (in, out) of each of them (LoRA's adapters)
    linears: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def matmul_weights_in_blocks(self) -> int:
        """The elements of the decoder blocks' linear weights (Muon's matrices)."""
        return sum(fan_in * out for pairs in self.linears.values() for fan_in, out in pairs)


def model_shapes(model: str, *, vocab_size: int, seq_len: int) -> Shapes:
    from hanlm import model as model_lib  # deferred: torch and transformers; the plan runs without

    config = model_lib.model_config(model, vocab_size=vocab_size, seq_len=seq_len)
    text = config.get_text_config()
    meta = model_lib.build_model(config, device="meta")
    params = [tuple(param.shape) for param in meta.parameters()]
    counts = model_lib.parameter_count(config)
    heads = getattr(text, "num_attention_heads", 0) or 0
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    flops = model_lib.flops_per_token(config, seq_len)
    import torch  # deferred as hanlm.model above

    linears: dict[str, list[tuple[int, int]]] = {}
    for path, module in meta.named_modules():
        if isinstance(module, torch.nn.Linear) and path != "lm_head":
            linears.setdefault(path.rsplit(".", 1)[-1], []).append(
                (module.in_features, module.out_features)
            )
    return Shapes(
        params=params,
        layer_params=counts["per_layer"],
        root_params=counts["total"] - text.num_hidden_layers * counts["per_layer"],
        matmul_weights=flops["dense"] // 6,
        embedding=counts["embedding"],
        hidden=text.hidden_size,
        query_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        ffn=getattr(text, "intermediate_size", 4 * text.hidden_size),
        heads=heads,
        head_dim=head_dim,
        layers=text.num_hidden_layers,
        vocab=text.vocab_size,
        n_params=counts["total"],
        flops=flops,
        linears=linears,
    )


# --- memory -------------------------------------------------------------------------------------


def lora_trained(shapes: Shapes, lora: LoraPlan) -> tuple[int, int]:
    """(LoRA's trained elements, their tensors): A (r x in) and B (out x r) per adapted layer,
    and the trained embedding rows."""
    pairs = [pair for target in lora.targets for pair in shapes.linears.get(target, [])]
    elements = sum(lora.rank * (fan_in + fan_out) for fan_in, fan_out in pairs)
    elements += lora.token_rows * shapes.hidden
    return elements, 2 * len(pairs) + (1 if lora.token_rows else 0)


def model_state_bytes(
    shapes: Shapes,
    world: int,
    parallel: str,
    lora: LoraPlan | None = None,
    precision: str = "fp32",
    optimizer: str = "adamw",
) -> dict[str, int]:
    """Bytes of the float32 weights, gradients and optimizer states one rank holds after a step.

    AdamW (fused or not) keeps exp_avg and exp_avg_sq like the parameter and a float32 `step`
    scalar per tensor. Muon (`optimizer = "muon"`, hanlm.train.muon) keeps one momentum buffer
    per block matrix, AdamW's two moments elsewhere, and gathers one whole matrix at a time for
    Newton-Schulz (its float32 update and three bfloat16 iterates: the largest matrix's).
    FSDP2 shards every tensor's first dimension, padded to equal shards.
    With LoRA the model's weights stay (frozen: no gradient, no AdamW state) and only the
    adapters and the trained rows have both; below fp32 the blocks' frozen linear layers are
    held in the compute dtype (hanlm.train.lora.hold_frozen_linears).
    """
    sharded = parallel == "fsdp" and world > 1

    def local(shape: tuple[int, ...]) -> int:
        rows = math.ceil(shape[0] / world) if sharded and shape else (shape[0] if shape else 1)
        return rows * math.prod(shape[1:])

    elements = sum(local(shape) for shape in shapes.params)
    if lora is not None:
        trained, tensors = lora_trained(shapes, lora)
        trained = math.ceil(trained / world) if sharded else trained
        # a linear layer's weight is (out, in): FSDP2 shards its out rows
        low = 0
        if precision != "fp32":
            low = sum(
                local((out, fan_in)) for pairs in shapes.linears.values() for fan_in, out in pairs
            )
        return {
            "weights": 4 * (elements - low + trained) + PARAM_BYTES[precision] * low,
            "gradients": 4 * trained,
            "optimizer": 8 * trained + 4 * tensors,
        }
    if optimizer == "muon":
        blocks = [(out, fan_in) for pairs in shapes.linears.values() for fan_in, out in pairs]
        matrices = sum(local(shape) for shape in blocks)
        largest = max((math.prod(shape) for shape in blocks), default=0)
        adamw_tensors = len(shapes.params) - len(blocks)
        return {
            "weights": 4 * elements,
            "gradients": 4 * elements,
            "optimizer": 4 * matrices + 8 * (elements - matrices) + 4 * adamw_tensors
            + (4 + 3 * 2) * largest,
        }  # fmt: skip
    return {
        "weights": 4 * elements,
        "gradients": 4 * elements,
        "optimizer": 8 * elements + 4 * len(shapes.params),
    }


def working_copy_bytes(shapes: Shapes, setup: Setup) -> int:
    """The weights that compute reads, beside the float32 masters."""
    if setup.sharded:
        # FSDP2 all-gathers into full-size parameters of the compute dtype (fp32 included):
        # two layers at once (one computing, one prefetched) and the root, kept unsharded
        # from forward to backward
        return PARAM_BYTES[setup.precision] * (2 * shapes.layer_params + shapes.root_params)
    if setup.precision == "fp32":
        return 0
    if setup.lora is not None:
        # the blocks' frozen linears are held in the compute dtype: only the output head (tied
        # to the float32 embedding) and the adapters are cast
        adapters, _ = lora_trained(shapes, setup.lora)
        return 2 * (shapes.vocab * shapes.hidden + adapters)
    if setup.recompute == "none":
        return 2 * shapes.matmul_weights  # autocast's cached casts, saved for backward
    # recomputed layers cast their weights again in backward, one layer at a time
    output_projection = shapes.vocab * shapes.hidden
    layer_matmuls = (shapes.matmul_weights - output_projection) // shapes.layers
    return 2 * (output_projection + layer_matmuls)


def fsdp_gradient_bytes(shapes: Shapes, setup: Setup) -> int:
    """FSDP2's full-size gradients of a layer before its reduce-scatter: autograd's, in the
    compute dtype, and the float32 reduce-scatter input they are copied into (the previous
    layer's input is released first, with the default of one kept)."""
    if not setup.sharded or setup.lora is not None:  # LoRA: the frozen weights have none
        return 0
    return (PARAM_BYTES[setup.precision] + 4) * shapes.layer_params


def checkpoint_staging_bytes(shapes: Shapes, setup: Setup) -> int:
    """The host copy an asynchronous save stages: this rank's weights and AdamW state (under
    DDP rank 0 alone stages the one replica, so the worst rank holds it all)."""
    if not setup.async_checkpoint:
        return 0
    state = model_state_bytes(
        shapes,
        setup.world,
        setup.parallel,
        optimizer=setup.optimizer if not setup.lora else "adamw",
    )
    return state["weights"] + state["optimizer"]


def _layer_activation_bytes(
    shapes: Shapes, precision: str, recompute: str, bf16_params: bool, compiled: bool = False
) -> int:
    """Bytes one decoder layer saves for backward, per token (Llama: RMSNorm, RoPE, SDPA, SwiGLU).

    Eager, float32: each RMSNorm saves its input, its normalised output and the scaled output
    (3h); attention saves the rotated q and k, v and SDPA's output (2q + 2kv); the MLP saves gate,
    up, SiLU(gate) and their product (4f). Under bf16 autocast the residual stream stays float32:
    a norm saves 8h bytes in float32 plus a bf16 cast of its output for each projection that
    reads it (q, k, v: 3; gate, up: 2); everything between the projections is bf16. With FSDP2's
    bf16 parameters the stream is bf16 and a norm saves 8h (float32 copy and bf16 outputs).
    Selective recomputation keeps the layer input and the matmul and attention outputs;
    full keeps the layer input alone. SDPA's log-sum-exp is 4 bytes per head.

    Compiled (`parallel.compile`, bf16 or FP8 without recomputation): inductor's partitioner
    saves the matmul and attention outputs and recomputes the element-wise work from them, so a
    layer keeps its two residual-stream inputs (the layer's and the MLP's), q, k, v and SDPA's
    output, and gate, up and their SiLU product (6f). With FP8 (torchao's Float8Linear) the
    saved inputs of the projections are their FP8 casts (1 byte: 2h + q + f) and the MLP keeps
    none of its bf16 products. Measured on an H200 (benchmarks/gpu_train.py, seq 2,048 x 16, torch
    2.11): the bf16 rule within 4% of the activations at `350m` and `1.3b`, the FP8 one within 8%.
    """
    h, q, kv, f = shapes.hidden, shapes.query_width, shapes.kv_width, shapes.ffn
    lse = 4 * shapes.heads
    stream = 2 if bf16_params else 4  # bytes of a residual-stream element
    if recompute == "full":
        return stream * h
    if compiled and recompute == "none" and precision != "fp32":
        attention = 2 * (2 * q + 2 * kv)
        if precision == "fp8":
            return 2 * stream * h + attention + (2 * h + q + f) + lse
        return 2 * stream * h + attention + 2 * 3 * f + lse
    if precision == "fp32":
        if recompute == "selective":
            return 4 * (3 * h + 2 * q + 2 * kv + 2 * f) + lse
        return 4 * (6 * h + 2 * q + 2 * kv + 4 * f) + lse
    if recompute == "selective":
        return stream * h + 2 * (q + 2 * kv + 2 * h + 2 * f) + 2 * q + lse
    norms = 16 * h if bf16_params else (8 * h + 3 * 2 * h) + (8 * h + 2 * 2 * h)
    return norms + 2 * (2 * q + 2 * kv) + 2 * 4 * f + lse


def activation_bytes(shapes: Shapes, setup: Setup) -> dict[str, int]:
    """Bytes saved for backward per rank: the layers, and the embedding and final norm."""
    tokens = setup.seq_len * setup.micro_batch
    bf16_params = setup.parallel == "fsdp" and setup.world > 1 and setup.precision != "fp32"
    per_layer = _layer_activation_bytes(
        shapes, setup.precision, setup.recompute, bf16_params, setup.compiled
    )
    if setup.precision == "fp32":
        final_norm = 12 * shapes.hidden
    else:
        final_norm = (8 if bf16_params else 10) * shapes.hidden
    # Recomputation rebuilds one layer's activations at a time during backward.
    recomputed = 0
    if setup.recompute != "none":
        recomputed = _layer_activation_bytes(shapes, setup.precision, "none", bf16_params) * tokens
    rope = 2 * 4 * setup.seq_len * shapes.head_dim * shapes.layers  # cos and sin per layer
    return {
        "layers": shapes.layers * per_layer * tokens,
        "recomputed": recomputed,
        "other": final_norm * tokens + rope,
    }


def logits_bytes(shapes: Shapes, setup: Setup) -> dict[str, int]:
    """The loss's bytes (hanlm.train.loss, `loss_chunk_tokens` tokens at a time).

    forward: what the loss keeps for backward, the gradients it computes with it: of the final
    hidden states (a residual-stream element each) and of the output head (in the weight's
    dtype: float32, or bf16 as FSDP2 gathers it). loss: what computing it holds on top at its
    peak: one chunk's float32 logits, their log-softmax and two gradients in backward (12 bytes
    an element; the compute dtype's logits are freed as they are upcast) and, for a bf16 head,
    the head's gradient summed in float32 (4 bytes an element, 2 more than its bf16 copy kept).
    Under autocast the head's bf16 copy is among the working copies.
    """
    tokens = setup.seq_len * setup.micro_batch
    chunk = min(setup.loss_chunk_tokens, tokens)
    bf16_params = setup.parallel == "fsdp" and setup.world > 1 and setup.precision != "fp32"
    stored = 2 if bf16_params else 4  # bytes of a hidden-state and a head-weight element
    head = shapes.vocab * shapes.hidden
    forward = stored * (tokens * shapes.hidden + head)
    loss = 12 * chunk * shapes.vocab + (2 * head if bf16_params else 0)
    return {"forward": forward, "loss": loss}


def full_logits_bytes(shapes: Shapes, setup: Setup) -> int:
    """What the loss took before it was chunked: the micro-batch's logits in the compute dtype,
    their float32 log-softmax and its gradient (for comparison)."""
    elements = setup.seq_len * setup.micro_batch * shapes.vocab
    return (PRECISION_BYTES[setup.precision] + 8) * elements


def memory(setup: Setup, shapes: Shapes | None = None) -> dict[str, Any]:
    """Itemised bytes per GPU, their total with the framework allowance, and the verdict."""
    shapes = shapes or model_shapes(setup.model, vocab_size=setup.vocab_size, seq_len=setup.seq_len)
    state = model_state_bytes(
        shapes, setup.world, setup.parallel, setup.lora, setup.precision, setup.optimizer
    )
    acts = activation_bytes(shapes, setup)
    logits = logits_bytes(shapes, setup)
    items = {
        ("weights (frozen; adapters fp32)" if setup.lora else "weights (fp32 master)"): state[
            "weights"
        ],
        "gradients (fp32)": state["gradients"],
        OPTIMIZER_ITEM[setup.optimizer if not setup.lora else "adamw"]: state["optimizer"],
        "working copies (casts, FSDP2 gathers)": working_copy_bytes(shapes, setup),
        "gradients before reduce-scatter": fsdp_gradient_bytes(shapes, setup),
        f"activations ({setup.recompute} recompute)": sum(acts.values()),
        "loss (chunked logits)": logits["forward"] + logits["loss"],
    }
    on_cpu = setup.gpu == "cpu"
    if on_cpu:
        items["checkpoint staging (async save)"] = checkpoint_staging_bytes(shapes, setup)
    subtotal = sum(items.values())
    runtime = CPU_RUNTIME_GIB if on_cpu else FRAMEWORK_GIB
    items["framework allowance"] = int(runtime * GIB + FRAGMENTATION * subtotal)
    total = sum(items.values())
    capacity = capacity_bytes(setup.gpu)
    out: dict[str, Any] = {"items": items, "total": total, "capacity": capacity}
    if capacity is not None:
        out["fits"] = total <= capacity
        out["margin"] = capacity - total
    return out


def capacity_bytes(gpu: str | None) -> int | None:
    if gpu is None:
        return None
    if gpu == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # the catalogue's GB are what nvidia-smi shows in GiB (a "32 GB" card has ~31.8 GiB)
    return int(find(gpu).memory_gb * GIB)


# --- time and cost ------------------------------------------------------------------------------


def default_mfu(gpu: str | None, precision: str) -> tuple[float, str]:
    if gpu == "cpu" or gpu is None:
        return CPU_MFU, "CPU: half the measured matmul peak"
    key = find(gpu).key
    bf16 = DEFAULT_BF16_MFU[key]
    if precision == "fp8":
        return bf16 * FP8_MFU_FACTOR, f"{bf16:.0%} bf16 x {FP8_MFU_FACTOR} for FP8 (of FP8 peak)"
    return bf16, f"typical bf16 MFU for {find(gpu).name}"


def peak_flops(gpu: str | None, precision: str) -> float:
    if gpu == "cpu" or gpu is None:
        return measured_cpu_peak_flops()
    entry = find(gpu)
    if precision == "fp8":
        if entry.fp8_tflops is None:
            raise UserError(
                f"{entry.name} has no FP8 tensor cores",
                fix="use --precision bf16, or a GPU of compute capability 8.9+ (Ada, Hopper, "
                "Blackwell)",
            )
        return entry.fp8_tflops * 1e12
    if precision == "fp32":
        return entry.bf16_tflops * 1e12 / 2  # TF32 tensor cores: half the bf16 rate
    return entry.bf16_tflops * 1e12


def link_bytes_per_s(setup: Setup) -> tuple[float, str]:
    """The slowest link of the ring: the GPUs' interconnect, or the hosts' network."""
    if setup.gpu in (None, "cpu"):
        return 10e9, "host memory"
    entry = find(setup.gpu)
    intra = entry.interconnect_gbs * 1e9
    if setup.hosts > 1:
        inter = setup.inter_host_gbps * 1e9 / 8
        if inter < intra:
            return inter, f"{setup.inter_host_gbps:g} Gbit/s between hosts"
    return intra, entry.interconnect


def comm_bytes_per_step(shapes: Shapes, setup: Setup, accumulation: int) -> float:
    """Bytes each rank sends per optimizer step (ring algorithms: (n-1)/n of the payload per
    all-gather or reduce-scatter, twice that per all-reduce)."""
    n = setup.world
    if n == 1 or setup.parallel == "single":
        return 0.0
    share = (n - 1) / n
    if setup.parallel == "ddp":  # one float32 gradient all-reduce per step (no_sync before)
        return 2 * share * 4 * shapes.n_params
    param_bytes = 4 if setup.precision == "fp32" else 2
    # per micro-step: parameters gathered for forward and again for backward, float32
    # gradients reduce-scattered
    per_step = accumulation * share * (2 * param_bytes * shapes.n_params + 4 * shapes.n_params)
    if setup.optimizer == "muon" and not setup.lora:  # each block matrix's update gathered whole
        per_step += share * 4 * shapes.matmul_weights_in_blocks
    return per_step


def throughput(setup: Setup, shapes: Shapes) -> dict[str, Any]:
    tokens_per_micro = setup.seq_len * setup.micro_batch * setup.world
    global_batch = setup.global_batch_tokens or tokens_per_micro
    accumulation = max(1, math.ceil(global_batch / tokens_per_micro))
    tokens_per_step = accumulation * tokens_per_micro
    mfu, mfu_source = (setup.mfu, "given") if setup.mfu else default_mfu(setup.gpu, setup.precision)
    peak = peak_flops(setup.gpu, setup.precision)
    six_n = shapes.flops["six_n"]
    compute_s = (
        tokens_per_step * six_n * RECOMPUTE_COST[setup.recompute] / (setup.world * peak * mfu)
    )
    link, link_name = link_bytes_per_s(setup)
    comm_s = comm_bytes_per_step(shapes, setup, accumulation) / link
    exposed = max(0.0, comm_s - COMM_OVERLAP * compute_s)
    step_s = compute_s + exposed
    out: dict[str, Any] = {
        "mfu": mfu,
        "mfu_source": mfu_source,
        "peak_flops_per_gpu": peak,
        "flops_per_token_6n": six_n,
        "flops_per_token_with_attention": shapes.flops["total"],
        "attention_adds": shapes.flops["total"] / six_n - 1,  # exact count with attention vs 6·N
        "tokens_per_step": tokens_per_step,
        "accumulation": accumulation,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "comm_link": link_name,
        "exposed_comm_s": exposed,
        "step_s": step_s,
        "tokens_per_s": tokens_per_step / step_s,
    }
    if setup.optimizer == "muon" and not setup.lora:
        out["optimizer_note"] = MUON_TOKENS_NOTE
    if setup.tokens:
        steps = setup.tokens / tokens_per_step
        wall_s = steps * step_s
        gpu_hours = wall_s * setup.world / 3600
        out.update(steps=math.ceil(steps), wall_hours=wall_s / 3600, gpu_hours=gpu_hours)
        # the same run counted with attention FLOPs at the same MFU
        out["gpu_hours_with_attention"] = gpu_hours * shapes.flops["total"] / six_n
        if setup.price_per_gpu_hour is not None:
            out["cost"] = gpu_hours * setup.price_per_gpu_hour
            out["cost_with_attention"] = out["gpu_hours_with_attention"] * setup.price_per_gpu_hour
    return out


# --- the plan -----------------------------------------------------------------------------------


def check(setup: Setup) -> None:
    if setup.gpu not in (None, "cpu"):
        find(setup.gpu)  # a UserError listing the known GPUs
    for name, value in (("gpus", setup.gpus), ("hosts", setup.hosts)):
        if value < 1:
            raise UserError(f"--{name} must be at least 1, got {value}")
    if setup.parallel not in PARALLEL_MODES:
        raise UserError(
            f"unknown parallelism {setup.parallel!r}", fix=f"use one of {', '.join(PARALLEL_MODES)}"
        )
    if setup.parallel == "single" and setup.world > 1:
        raise UserError("--parallel single runs one process", fix="use ddp or fsdp for --gpus > 1")
    if setup.recompute not in RECOMPUTE_MODES:
        raise UserError(
            f"unknown recomputation {setup.recompute!r}",
            fix=f"use one of {', '.join(RECOMPUTE_MODES)}",
        )
    if setup.precision not in PRECISION_BYTES:
        raise UserError(
            f"precision {setup.precision!r} cannot be planned",
            fix="use fp32, bf16 or fp8 (fp4 is refused by pretraining)",
        )
    if setup.mfu is not None and not 0 < setup.mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {setup.mfu}", fix="e.g. --mfu 0.4")


class ModelSize(Part):
    parameters: int
    layers: int
    hidden: int
    vocab: int


class MemoryPlan(Part):
    """Bytes per device by item, their total, and against the device's capacity (when known)."""

    items: dict[str, int]
    total: int
    capacity: int | None
    fits: bool | None = None
    margin: int | None = None


class TimePlan(Part):
    """One optimizer step's time and the throughput; with a token budget, hours and cost."""

    mfu: float
    mfu_source: str
    peak_flops_per_gpu: float
    flops_per_token_6n: int
    flops_per_token_with_attention: int
    attention_adds: float
    tokens_per_step: int
    accumulation: int
    compute_s: float
    comm_s: float
    comm_link: str
    exposed_comm_s: float
    step_s: float
    tokens_per_s: float
    steps: int | None = None
    wall_hours: float | None = None
    gpu_hours: float | None = None
    gpu_hours_with_attention: float | None = None
    cost: float | None = None
    cost_with_attention: float | None = None
    optimizer_note: str | None = None  # what the token budget assumes of the optimizer


class PlanOption(Part):
    """One configuration the recommendation compares."""

    gpus: int
    hosts: int
    parallel: str
    recompute: str
    micro_batch: int
    memory_gib: float
    margin_gib: float
    tokens_per_s: float
    gpu_hours: float | None = None
    wall_hours: float | None = None
    cost: float | None = None


class Recommendation(Part):
    best: PlanOption
    alternatives: list[PlanOption]


class Plan(Result):
    """`plan/plan.json`: the setup planned, the model's size, and either the memory, time and
    recommendation for the chosen GPU or (no GPU chosen) the catalogue's `options`; the data
    stages' time when the setup sizes them."""

    FILE = "plan.json"
    MADE_BY = "plan"

    setup: Setup
    model: ModelSize
    data: dict[str, Any] | None = None  # hanlm.plan.data_rates.data_time
    mixture: list[dict[str, Any]] | None = None  # hanlm.data.mixture.preview, for sources mixed
    options: list[dict[str, Any]] | None = None  # catalogue_overview, without a GPU
    memory: MemoryPlan | None = None
    time: TimePlan | None = None
    recommendation: Recommendation | None = None
    sft: dict[str, Any] | None = None  # sft_memory: SFT's memory per GPU, full and LoRA


def plan_recipe(cfg, *, plan_section=None) -> Plan:
    """The plan of a recipe: its setup's (make_plan), and its training mix's preview when its
    corpus sources have weights."""
    setup = setup_from_config(cfg, plan_section=plan_section)
    plan = make_plan(setup)
    update: dict[str, Any] = {"mixture": mixture_preview(cfg)}
    if setup.gpu is not None:
        update["sft"] = sft_memory(cfg, setup)
    return plan.model_copy(update=update)


# the chat template's tokens whose rows LoRA trains by default (hanlm.chat.tokens.TEMPLATE_TOKENS)
CHAT_TOKEN_ROWS = 4


def sft_memory(cfg, setup: Setup) -> dict[str, Any]:
    """SFT's memory per GPU on the plan's hardware, at sft.seq_len and sft.micro_batch: full
    fine-tuning (every weight with its gradient and AdamW state) beside LoRA (sft.lora: the
    weights frozen, the adapters and the chat tokens' rows trained)."""
    lora = cfg.sft.lora
    base = replace(setup, seq_len=cfg.sft.seq_len, micro_batch=cfg.sft.micro_batch)
    shapes = model_shapes(base.model, vocab_size=base.vocab_size, seq_len=base.seq_len)
    plan = LoraPlan(lora.rank, tuple(lora.target_modules), CHAT_TOKEN_ROWS)
    trained, _ = lora_trained(shapes, plan)
    # FP8 converts the linear layers LoRA wraps (SFT refuses the pair): LoRA runs in bf16
    lora_precision = "bf16" if base.precision == "fp8" else base.precision
    return {
        "seq_len": base.seq_len,
        "micro_batch": base.micro_batch,
        "method": cfg.sft.method,
        "lora_rank": lora.rank,
        "lora_targets": list(lora.target_modules),
        "lora_trained_parameters": trained,
        "precision": base.precision,
        "lora_precision": lora_precision,
        "full": memory(base, shapes),
        "lora": memory(
            replace(
                base,
                lora=plan,
                precision=lora_precision,
                compiled=blocks_compile(lora_precision, cfg.parallel.compile),
            ),
            shapes,
        ),
    }


def make_plan(setup: Setup) -> Plan:
    check(setup)
    shapes = model_shapes(setup.model, vocab_size=setup.vocab_size, seq_len=setup.seq_len)
    plan: dict[str, Any] = {
        "setup": setup,
        "model": {
            "parameters": shapes.n_params,
            "layers": shapes.layers,
            "hidden": shapes.hidden,
            "vocab": shapes.vocab,
        },
    }
    if setup.data is not None:
        plan["data"] = data_time(setup.data)
    if setup.gpu is None:
        plan["options"] = catalogue_overview(setup, shapes)
        return Plan.model_validate(plan)
    plan["memory"] = memory(setup, shapes)
    plan["time"] = throughput(setup, shapes)
    plan["recommendation"] = recommend(setup, shapes)
    return Plan.model_validate(plan)


def candidates(setup: Setup) -> list[Setup]:
    """The configurations the recommendation compares: 1, 2, 4, 8 and the given number of GPUs
    per host, each parallelism, each recomputation, micro-batches halving from the given one."""
    counts = [1] if setup.gpu == "cpu" else sorted({1, 2, 4, 8, setup.gpus})
    micro = sorted({max(1, setup.micro_batch >> k) for k in range(6)})
    out = []
    for gpus in counts:
        for parallel in ("single",) if gpus * setup.hosts == 1 else ("ddp", "fsdp"):
            for recompute in RECOMPUTE_MODES:
                for mb in micro:
                    out.append(
                        replace(
                            setup, gpus=gpus, parallel=parallel, recompute=recompute, micro_batch=mb
                        )
                    )
    return out


def recommend(setup: Setup, shapes: Shapes) -> dict[str, Any] | None:
    """The cheapest fitting candidate (by GPU-hours, then wall time), and the runners-up."""
    rows = []
    for option in candidates(setup):
        mem = memory(option, shapes)
        if not mem.get("fits"):
            continue
        timing = throughput(option, shapes)
        gpu_seconds = timing["step_s"] * option.world / timing["tokens_per_step"]  # per token
        rows.append(
            (gpu_seconds, timing["step_s"] / timing["tokens_per_step"], option, mem, timing)
        )
    if not rows:
        return None
    # Equal cost: the faster run, then the larger micro-batch (the planner's MFU does not
    # model small batches' lower efficiency), then the larger margin.
    rows.sort(key=lambda row: (row[0], row[1], -row[2].micro_batch, -row[3]["margin"]))

    def describe(row) -> dict[str, Any]:
        _, _, option, mem, timing = row
        out = {
            "gpus": option.gpus,
            "hosts": option.hosts,
            "parallel": option.parallel,
            "recompute": option.recompute,
            "micro_batch": option.micro_batch,
            "memory_gib": mem["total"] / GIB,
            "margin_gib": mem["margin"] / GIB,
            "tokens_per_s": timing["tokens_per_s"],
        }
        for key in ("gpu_hours", "wall_hours", "cost"):
            if key in timing:
                out[key] = timing[key]
        return out

    return {"best": describe(rows[0]), "alternatives": [describe(row) for row in rows[1:4]]}


def catalogue_overview(setup: Setup, shapes: Shapes) -> list[dict[str, Any]]:
    """Without a GPU: for each catalogue GPU, the fewest that fit with FSDP and the GPU-hours."""
    rows = []
    for key, gpu in CATALOGUE.items():
        row: dict[str, Any] = {"gpu": key, "name": gpu.name, "memory_gb": gpu.memory_gb}
        if setup.precision == "fp8" and gpu.fp8_tflops is None:
            row["note"] = "no FP8"
            rows.append(row)
            continue
        for n in (1, 2, 4, 8, 16, 32, 64):
            option = replace(
                setup, gpu=key, gpus=n, hosts=1, parallel="single" if n == 1 else "fsdp"
            )
            if memory(option, shapes)["fits"]:
                row["min_gpus"] = n
                if setup.tokens:
                    row["gpu_hours"] = throughput(option, shapes)["gpu_hours"]
                break
        rows.append(row)
    return rows


def setup_from_config(cfg, *, plan_section=None, with_data: bool = True) -> Setup:
    """The Setup a run's recipe describes (pretrain model, batch, precision; plan hardware;
    with_data: the data stages' work, which sizes the local corpus inputs)."""
    pretrain, plan = cfg.pretrain, plan_section or cfg.plan
    tokens = plan.tokens
    if tokens is None:
        if pretrain.max_tokens is not None:
            tokens = pretrain.max_tokens
        elif pretrain.max_steps is not None:
            tokens = pretrain.max_steps * pretrain.global_batch_tokens
    parallel = cfg.parallel.mode
    world = plan.gpus * plan.hosts
    if parallel == "auto" or (parallel == "ddp" and world == 1):
        parallel = "single" if world == 1 else "fsdp"
    precision = "fp8" if cfg.precision.mode == "fp8-emulate" else cfg.precision.mode
    model, vocab_size = cfg.model.preset, cfg.tokenizer.vocab_size
    if cfg.model.init_from:  # continued pretraining: the model's own, with the tokens added
        from hanlm.model_folder import check_model_folder, vocab_rows

        base = check_model_folder(cfg.model.init_from)
        # spare rows may take some added tokens: at most this many
        model, vocab_size = str(base), vocab_rows(base) + cfg.tokenizer.extend
    return Setup(
        model=model,
        vocab_size=vocab_size,
        seq_len=pretrain.seq_len,
        micro_batch=pretrain.micro_batch,
        gpu=plan.gpu,
        gpus=plan.gpus,
        hosts=plan.hosts,
        precision=precision,
        parallel=parallel,
        recompute=cfg.parallel.activation_checkpointing,
        compiled=blocks_compile(precision, cfg.parallel.compile),
        optimizer=cfg.optimizer.name,
        tokens=tokens,
        global_batch_tokens=pretrain.global_batch_tokens,
        price_per_gpu_hour=plan.price_per_gpu_hour,
        mfu=plan.mfu,
        inter_host_gbps=plan.inter_host_gbps,
        data=data_work(cfg, tokens, plan) if with_data else None,
        loss_chunk_tokens=cfg.parallel.loss_chunk_tokens,
        async_checkpoint=cfg.checkpoint.async_save,
    )


def blocks_compile(precision: str, requested: bool | None) -> bool:
    """Whether a run compiles its decoder blocks: as set, or when unset with FP8 (FP8 is fast
    only compiled; hanlm.train.precision.compile_choice says why to the user)."""
    return precision == "fp8" if requested is None else requested


def step_profile(
    cfg, *, world_size: int, peak_flops: float, mfu: float | None = None
) -> dict[str, Any]:
    """What one optimizer step of the run's recipe needs on `world_size` devices: for preflight."""
    setup = replace(setup_from_config(cfg, with_data=False), gpus=world_size, hosts=1)
    if setup.parallel == "single" and world_size > 1:
        setup = replace(setup, parallel="fsdp")
    shapes = model_shapes(setup.model, vocab_size=setup.vocab_size, seq_len=setup.seq_len)
    tokens_per_micro = setup.seq_len * setup.micro_batch * world_size
    accumulation = max(1, math.ceil((setup.global_batch_tokens or 0) / tokens_per_micro))
    tokens_per_step = accumulation * tokens_per_micro
    mfu = mfu or default_mfu(setup.gpu, setup.precision)[0]
    compute_s = (
        tokens_per_step
        * shapes.flops["six_n"]
        * RECOMPUTE_COST[setup.recompute]
        / (world_size * peak_flops * mfu)
    )
    state = model_state_bytes(shapes, 1, "single", optimizer=setup.optimizer)
    return {
        "tokens_per_step": tokens_per_step,
        "compute_s": compute_s,
        "comm_bytes_per_gpu": comm_bytes_per_step(shapes, setup, accumulation),
        "checkpoint_bytes": state["weights"] + state["optimizer"],
        "tokens_per_s_needed": tokens_per_step / compute_s,
    }
