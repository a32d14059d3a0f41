"""What `hanlm plan` plans: one training setup (model, batch, hardware, precision, parallelism),
checked, and the shapes of its model, read from the model built on the meta device.

The memory model (hanlm.plan.memory_model) and the time and cost model (hanlm.plan.time_model)
read both; hanlm.plan.recipe makes the setup of a run's recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hanlm.errors import UserError
from hanlm.plan.catalogue import find
from hanlm.plan.data_rates import DataWork

PARALLEL_MODES = ("single", "ddp", "fsdp")
RECOMPUTE_MODES = ("none", "selective", "full")  # parallel.activation_checkpointing
PRECISIONS = ("fp32", "bf16", "fp8")  # what can be planned: pretraining refuses fp4
DEFAULT_INTER_HOST_GBPS = 25.0  # a rented host's Ethernet, Gbit/s
DEFAULT_LOSS_CHUNK_TOKENS = 1024  # [parallel] loss_chunk_tokens (hanlm.train.loss)


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
    # pretraining's tokens/s over all devices as a rehearsal measured them on this hardware
    # (hanlm.plan.measured), and where: they replace the assumed MFU
    measured_tokens_per_s: float | None = None
    measured_by: str | None = None

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


def check(setup: Setup) -> None:
    """A UserError, naming the flag, when `setup` cannot be planned."""
    if setup.gpu not in (None, "cpu"):
        find(setup.gpu)  # a UserError listing the known GPUs
    for name, value in (("gpus", setup.gpus), ("hosts", setup.hosts)):
        if value < 1:
            raise UserError(f"plan.{name} (--{name}) must be at least 1, got {value}")
    if setup.parallel not in PARALLEL_MODES:
        raise UserError(
            f"unknown parallelism {setup.parallel!r}", fix=f"use one of {', '.join(PARALLEL_MODES)}"
        )
    if setup.parallel == "single" and setup.world > 1:
        raise UserError(
            f'parallel.mode = "single" runs one process, but the plan has {setup.gpus} GPU(s) on '
            f"each of {setup.hosts} host(s) (plan.gpus x plan.hosts = {setup.world})",
            fix='set parallel.mode to "fsdp" or "ddp" (--parallel) to use them all, or plan.gpus '
            "and plan.hosts to 1 (--gpus, --hosts) for one GPU",
        )
    if setup.recompute not in RECOMPUTE_MODES:
        raise UserError(
            f"unknown recomputation {setup.recompute!r}",
            fix=f"use one of {', '.join(RECOMPUTE_MODES)}",
        )
    if setup.precision not in PRECISIONS:
        raise UserError(
            f"precision {setup.precision!r} cannot be planned",
            fix="use fp32, bf16 or fp8 (fp4 is refused by pretraining)",
        )
    if setup.mfu is not None and not 0 < setup.mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {setup.mfu}", fix="e.g. --mfu 0.4")


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
