"""`hanlm plan`'s memory model: will it fit, before any GPU is rented.

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
"""

from __future__ import annotations

import math
import os

from hanlm.plan.catalogue import find
from hanlm.plan.inputs import LoraPlan, Setup, Shapes, model_shapes
from hanlm.results import Part

GIB = 1 << 30
FRAMEWORK_GIB = 1.5  # CUDA context (~0.5 GiB), cuBLAS/NCCL workspaces, kernels
CPU_RUNTIME_GIB = 0.5  # a CPU rank's interpreter, torch, transformers, process group
FRAGMENTATION = 0.05  # the caching allocator's unusable share of what it holds
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp8": 2}  # activation dtype; FP8 saves bf16 inputs
PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp8": 2}  # FSDP2's gathered parameters and their gradients
OPTIMIZER_ITEM = {
    "adamw": "optimizer (AdamW m, v)",
    "muon": "optimizer (Muon momentum; AdamW m, v)",
}


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


class MemoryPlan(Part):
    """Bytes per device by item, their total, and against the device's capacity (when known)."""

    items: dict[str, int]
    total: int
    capacity: int | None
    fits: bool | None = None
    margin: int | None = None


def memory(setup: Setup, shapes: Shapes | None = None) -> MemoryPlan:
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
    if capacity is None:
        return MemoryPlan(items=items, total=total, capacity=None)
    return MemoryPlan(
        items=items, total=total, capacity=capacity, fits=total <= capacity, margin=capacity - total
    )


def capacity_bytes(gpu: str | None) -> int | None:
    if gpu is None:
        return None
    if gpu == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # the catalogue's GB are what nvidia-smi shows in GiB (a "32 GB" card has ~31.8 GiB)
    return int(find(gpu).memory_gb * GIB)
