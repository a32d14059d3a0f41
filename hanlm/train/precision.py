"""Training precision: fp32, bf16, FP8 through torchao.float8 (or its CPU emulation); FP4 refused.

`resolve` turns the configured name into a `Numerics` and refuses, before anything is built,
what the device cannot run. Master weights and optimizer states stay float32 in every precision.
`apply_fp8` swaps the model's large `nn.Linear` layers for torchao's `Float8Linear`; pretraining
and SFT both call it (the output head stays in high precision), and a checkpoint of a converted
model holds the same plain `weight`/`bias` tensors as an unconverted one, so export needs nothing
FP8-specific.

FP8 pays only compiled. torchao fuses FP8's scaling and casting into the surrounding kernels under
`torch.compile`; eager `Float8Linear` runs them as separate kernels and has measured slower than
bf16 (pytorch/ao#685: a 512-wide FFN at 3.1 ms against 0.9 ms in fp16, 0.95 ms compiled;
pytorch/ao#1199: a 7B model's throughput fell). torchtitan calls compile "required for
competitive performance" with float8, and compiles each transformer block, as hanlm does. So
`compile_choice` decides `parallel.compile`: left unset, it is on with `fp8` (said in one info
line) and off otherwise; set to false with `fp8`, training runs eagerly with a warning that says
why it will be slow (the user may need eager mode, e.g. to debug, so it is not refused). The
emulation (`fp8-emulate`) exists to check FP8's numerics on a CPU, where speed means nothing and
inductor needs a C++ compiler and minutes, so it compiles only when asked to. With the rowwise
recipe, compiled blocks emulate eager precision casts (torchtitan's workaround for
pytorch/pytorch#150859: RMS norm compiled with rowwise FP8 drove the loss to NaN).

`FP8_RECIPE_EVIDENCE` is the recipe table (docs/fp8.md renders it with `recipe_table`): for each
recipe, where it is documented to run and what was measured, by torchao or by hanlm.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.plan.recipe import blocks_compile

PRECISIONS = ("fp32", "bf16", "fp8", "fp8-emulate", "fp4")
FP8_RECIPES = ("tensorwise", "rowwise")

# torch._scaled_mm runs FP8 GEMMs from Ada (8.9) on.
FP8_MIN_CAPABILITY = (8, 9)
# Rowwise scaling needs a rowwise-scaled FP8 GEMM in torch._scaled_mm: PyTorch's CUTLASS kernel
# was Hopper-only (9.0) before 2.7, which added 8.9; cuBLAS has none for 11.x (Thor) and
# 12.x (consumer Blackwell, e.g. RTX 5090), where it answers CUBLAS_STATUS_NOT_SUPPORTED.
ROWWISE_UNSUPPORTED_MAJORS = (11, 12)
ROWWISE_ON_ADA_SINCE_TORCH = "2.7"
# FP8 GEMMs need both matrix dimensions to be multiples of 16.
FP8_DIM_MULTIPLE = 16

PRECISION_KEY = "precision.mode"
RECIPE_KEY = "precision.fp8_recipe"
ALL_GATHER_KEY = "parallel.fsdp_float8_all_gather"
COMPILE_KEY = "parallel.compile"

FP8_NEEDS = "FP8 needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell)"
FP4_REASON = (
    "FP4 training is refused: a team training a 1.35B Korean model on RTX 5090s found FP4 "
    "matmuls faster in isolation, but the per-layer quantisation overhead left the GPU waiting "
    "on the CPU and memory efficiency was worse than FP8, so each end-to-end training step was "
    "slower than with FP8. FP8 is the realistic baseline"
)


NOT_MEASURED = "not yet measured by hanlm"
TORCHAO_TRAINING_DOCS = (
    "torchao docs, e2e training benchmarks (docs.pytorch.org/ao/main/workflows/training.html): "
    "Llama3-8B, 8 GPUs, FSDP2, compile, seq 8192"
)


@dataclass(frozen=True)
class RecipeEvidence:
    """One row of the FP8 recipe table: where a recipe runs, on which versions, what was seen."""

    recipe: str
    gpus: str  # GPUs and their compute capability
    torch: str
    torchao: str
    published: str  # what its source measured (or "runs" where only documented)
    source: str
    hanlm: str = NOT_MEASURED


FP8_RECIPE_EVIDENCE = (
    RecipeEvidence(
        "tensorwise",
        "Ada, 8.9 (RTX 4090, L4, L40S)",
        "any torchao supports",
        "any",
        "runs (no end-to-end figure published)",
        "torch._scaled_mm runs FP8 GEMMs from compute capability 8.9 (hanlm's check_fp8)",
    ),
    RecipeEvidence(
        "tensorwise",
        "H100, 9.0",
        "2.7.0a0+gitb98af95",
        "0.10.0+git890e0ac8",
        "6,150 -> 7,689.5 tokens/s per GPU over bf16: 1.25x (with FP8 all-gather)",
        TORCHAO_TRAINING_DOCS,
    ),
    RecipeEvidence(
        "tensorwise",
        "H200, 9.0 (one GPU)",
        "2.11.0+cu130",
        "0.17.0",
        "none for models this small",
        "benchmarks/gpu_train.py (2026-12-04): hanlm's presets, seq 2,048 x 16, compiled blocks",
        "1.3b: 57,906 -> 68,499 tokens/s over bf16, 1.18x; 350m: 154,047 -> 155,695, 1.01x",
    ),
    RecipeEvidence(
        "tensorwise",
        "B200, 10.0 (power-limited)",
        "2.9.0.dev20250815+cu128",
        "0.13.0+gite4e681be6",
        "8,307.5 -> 10,417 tokens/s per GPU over bf16: 1.25x (with FP8 all-gather)",
        TORCHAO_TRAINING_DOCS,
    ),
    RecipeEvidence(
        "tensorwise",
        "consumer Blackwell, 12.0 (RTX 5090)",
        "not stated",
        "not stated",
        "FP8 (library and recipe not stated) trained a 1.35B Korean model; FP4 was slower",
        "the field report in docs/design.md; tensorwise is the only recipe hanlm allows on 12.x",
    ),
    RecipeEvidence(
        "rowwise",
        "Ada, 8.9",
        "2.7 or newer",
        "any",
        "runs (no end-to-end figure published)",
        "PyTorch 2.7 added sm89 to the rowwise-scaled CUTLASS GEMM (hanlm's check_rowwise)",
    ),
    RecipeEvidence(
        "rowwise",
        "H100, 9.0",
        "2.7.0a0+gitb98af95",
        "0.10.0+git890e0ac8",
        "6,150 -> 6,768 tokens/s per GPU over bf16: 1.10x (bf16 all-gather)",
        TORCHAO_TRAINING_DOCS,
    ),
    RecipeEvidence(
        "rowwise",
        "H200, 9.0 (2K-GPU cluster)",
        "not stated",
        "not stated",
        "1.34-1.43x over bf16 at scale, comparable convergence",
        "pytorch.org/blog/accelerating-training-float8-rowwise-crusoe",
    ),
    RecipeEvidence(
        "rowwise",
        "B200, 10.0 (power-limited)",
        "2.9.0.dev20250815+cu128",
        "0.13.0+gite4e681be6",
        "8,307.5 -> 8,640.5 tokens/s per GPU over bf16: 1.04x (bf16 all-gather)",
        TORCHAO_TRAINING_DOCS,
    ),
    RecipeEvidence(
        "rowwise",
        "11.x/12.x (Thor, RTX 5090)",
        "none",
        "none",
        "does not run: cuBLAS has no rowwise-scaled FP8 GEMM there (refused by hanlm)",
        "hanlm's check_rowwise (CUBLAS_STATUS_NOT_SUPPORTED)",
        "refused before training",
    ),
    RecipeEvidence(
        "both",
        "CPU (fp8-emulate)",
        "2.13.0+cpu",
        "0.18.0",
        "no speed: the emulation checks FP8 numerics only",
        "hanlm's tests (tests/integration/test_precision.py, tests/integration/test_sft.py)",
        "numerics only: losses within 1% of fp32; compiled blocks give eager's loss",
    ),
)


def recipe_table() -> str:
    """FP8_RECIPE_EVIDENCE as the Markdown table docs/fp8.md holds (a test keeps them equal)."""
    header = ("recipe", "GPU, compute capability", "torch", "torchao", "published", "source")
    lines = [
        "| " + " | ".join((*header, "hanlm")) + " |",
        "|" + "---|" * (len(header) + 1),
    ]
    for row in FP8_RECIPE_EVIDENCE:
        cells = (row.recipe, row.gpus, row.torch, row.torchao, row.published, row.source)
        lines.append("| " + " | ".join((*cells, row.hanlm)) + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Numerics:
    """How one run computes: what the trainer reads instead of the precision's name."""

    name: str  # one of PRECISIONS, never fp4
    param_dtype: torch.dtype  # master weights and optimizer states
    compute_dtype: torch.dtype  # activations and non-FP8 matmuls
    autocast: bool  # whether forward runs under torch.autocast(device, compute_dtype)
    fp8: bool  # whether apply_fp8 converts the model's linear layers
    recipe: str | None  # FP8 scaling recipe, None when not fp8

    def autocast_context(self, device: torch.device | str) -> contextlib.AbstractContextManager:
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.compute_dtype)


def resolve(precision: str, device: torch.device | str, *, recipe: str = "tensorwise") -> Numerics:
    """The plan for `precision` on `device`, or a UserError saying why the device can't."""
    device = torch.device(device)
    check_names(precision, recipe)
    if precision == "fp4":
        raise UserError(
            FP4_REASON,
            where=PRECISION_KEY,
            fix="use --precision fp8 (GPUs of compute capability 8.9+), or --precision bf16",
        )
    if precision == "fp32":
        return Numerics("fp32", torch.float32, torch.float32, False, False, None)
    if precision == "bf16":
        check_bf16(device)
        return Numerics("bf16", torch.float32, torch.bfloat16, True, False, None)
    if precision == "fp8-emulate":
        # No autocast: Float8Linear follows only CUDA autocast, so the emulation runs in float32.
        return Numerics("fp8-emulate", torch.float32, torch.float32, False, True, recipe)
    check_fp8(device, recipe)
    return Numerics("fp8", torch.float32, torch.bfloat16, True, True, recipe)


def check_names(precision: str, recipe: str) -> None:
    if precision not in PRECISIONS:
        usable = [p for p in PRECISIONS if p != "fp4"]
        raise UserError(
            f"unknown precision {precision!r}",
            where=PRECISION_KEY,
            fix=f"use one of {', '.join(usable)} (fp4 is refused)",
        )
    if recipe not in FP8_RECIPES:
        raise UserError(
            f"unknown FP8 recipe {recipe!r}",
            where=RECIPE_KEY,
            fix=f"use one of {', '.join(FP8_RECIPES)}",
        )


def check_bf16(device: torch.device) -> None:
    # CPU autocast runs bf16; a CUDA GPU needs it natively (emulated bf16 is slower than fp32).
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UserError(
            f"{gpu_label(device)} has no native bfloat16 support",
            where=PRECISION_KEY,
            fix="use --precision fp32",
        )


def check_fp8(device: torch.device, recipe: str) -> None:
    if device.type != "cuda":
        this = "this is a CPU" if device.type == "cpu" else f"this is a {device.type} device"
        raise UserError(
            f"{FP8_NEEDS}; {this}",
            where=PRECISION_KEY,
            fix="use fp8-emulate to test the FP8 path on CPU, or bf16/fp32",
        )
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability < FP8_MIN_CAPABILITY:
        fallback = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"
        raise UserError(
            f"{FP8_NEEDS}; this is {gpu_label(device)}",
            where=PRECISION_KEY,
            fix=f"use --precision {fallback}",
        )
    if recipe == "rowwise":
        check_rowwise(device, capability)


def check_rowwise(device: torch.device, capability: tuple[int, int]) -> None:
    if capability[0] in ROWWISE_UNSUPPORTED_MAJORS:
        raise UserError(
            f"rowwise FP8 scaling is not supported on {gpu_label(device)}: PyTorch has no "
            "rowwise-scaled FP8 matmul for compute capability 11.x/12.x (consumer Blackwell such "
            "as the RTX 5090); rowwise runs on 8.9 (with PyTorch 2.7+), 9.0 (Hopper) and 10.x "
            "(datacenter Blackwell)",
            where=RECIPE_KEY,
            fix='use fp8_recipe = "tensorwise"',
        )
    too_old = torch.torch_version.TorchVersion(torch.__version__) < ROWWISE_ON_ADA_SINCE_TORCH
    if capability < (9, 0) and too_old:
        raise UserError(
            f"rowwise FP8 scaling on {gpu_label(device)} needs PyTorch "
            f"{ROWWISE_ON_ADA_SINCE_TORCH} or newer (this is {torch.__version__}); older "
            "versions run it only on compute capability 9.0 or newer",
            where=RECIPE_KEY,
            fix=f'use fp8_recipe = "tensorwise", or upgrade PyTorch to {ROWWISE_ON_ADA_SINCE_TORCH}+',
        )


def gpu_label(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"


def apply_fp8(
    model: nn.Module,
    numerics: Numerics,
    *,
    min_features: int = 64,
    fsdp_float8_all_gather: bool = False,
) -> list[str]:
    """Swap large linear layers for torchao Float8Linear in place; returns their names.

    The output head and layers too small to gain stay in high precision. Convert before
    `fully_shard` and before building the optimizer: the swapped modules keep the same
    parameter objects, but FSDP float8 all-gather wraps the weights in a new tensor subclass.
    """
    if not numerics.fp8:
        return []
    if fsdp_float8_all_gather and numerics.recipe != "tensorwise":
        raise UserError(
            f"FSDP float8 all-gather works only with tensorwise scaling, not {numerics.recipe}: "
            "torchao all-gathers each weight in FP8 with one scale per tensor",
            where=ALL_GATHER_KEY,
            fix=f'set {RECIPE_KEY} = "tensorwise", or {ALL_GATHER_KEY} = false',
        )
    float8 = import_torchao_float8()
    config = dataclasses.replace(
        float8.Float8LinearConfig.from_recipe_name(numerics.recipe),
        emulate=numerics.name == "fp8-emulate",
        enable_fsdp_float8_all_gather=fsdp_float8_all_gather,
    )
    head = output_head(model)
    converted: list[str] = []

    def should_convert(module: nn.Module, name: str) -> bool:
        if module is head or not gains_from_fp8(module, min_features):
            return False
        converted.append(name)
        return True

    float8.convert_to_float8_training(model, module_filter_fn=should_convert, config=config)
    return converted


@dataclass(frozen=True)
class CompileChoice:
    """Whether the decoder blocks are compiled, and the line that says so when the precision
    decided it or the setting works against it."""

    enabled: bool
    note: str | None = None
    warning: bool = False


COMPILE_FOR_FP8 = (
    "FP8: compiling each decoder block, since torchao's FP8 is fast only under torch.compile "
    "(it fuses the scaling and casting kernels; eager Float8Linear has measured slower than "
    f"bf16); set {COMPILE_KEY} = false to train eagerly"
)
EAGER_FP8 = (
    f"FP8 without torch.compile ({COMPILE_KEY} = false): eager Float8Linear runs its scaling "
    "and casting as separate kernels and has measured slower than bf16, so this run will likely "
    f"be slower than --precision bf16; leave {COMPILE_KEY} unset (or true) for FP8's speed"
)


def compile_choice(precision: str, requested: bool | None) -> CompileChoice:
    """`parallel.compile` as set (None: unset) for a run in `precision`: on when asked, and
    when unset with fp8; fp8 set to eager runs with a warning (see the module docstring)."""
    enabled = blocks_compile(precision, requested)
    if requested is None and enabled:
        return CompileChoice(True, COMPILE_FOR_FP8)
    if not enabled and precision == "fp8":
        return CompileChoice(False, EAGER_FP8, warning=True)
    return CompileChoice(enabled)


def blocks_compiled(numerics: Numerics, requested: bool | None, *, announce: bool) -> bool:
    """Whether to compile the decoder blocks of a run in `plan`; says why when the precision
    decided (`announce`: on the main rank), and prepares inductor for the rowwise recipe."""
    choice = compile_choice(numerics.name, requested)
    if announce and choice.note:
        (warn if choice.warning else info)(choice.note)
    if choice.enabled and numerics.fp8 and numerics.recipe == "rowwise":
        # deferred: inductor is imported only by runs that compile
        import torch._inductor.config as inductor_config

        # compiled RMS norm + rowwise FP8 went to NaN losses unless inductor rounds its casts as
        # eager does (pytorch/pytorch#150859; torchtitan sets the same)
        inductor_config.emulate_precision_casts = True
    return choice.enabled


def output_head(model: nn.Module) -> nn.Module | None:
    """The layer producing logits: its FP8 rounding would hit the loss directly."""
    get_output_embeddings = getattr(model, "get_output_embeddings", None)
    if callable(get_output_embeddings):
        return get_output_embeddings()
    return getattr(model, "lm_head", None)


def gains_from_fp8(linear: nn.Module, min_features: int) -> bool:
    # Small GEMMs lose more to the dynamic scaling than FP8 tensor cores win back.
    dims = (linear.in_features, linear.out_features)
    return all(d >= min_features and d % FP8_DIM_MULTIPLE == 0 for d in dims)


def precompute_fp8_scales_if_needed(
    model: nn.Module, numerics: Numerics, fsdp_float8_all_gather: bool
) -> None:
    """Call after every optimizer step: one all-reduce computes every FP8 weight scale.

    Once computed, torchao reuses a scale at each all-gather until the next call, so skipping
    a step would all-gather updated weights with stale scales.
    """
    if numerics.fp8 and fsdp_float8_all_gather:
        import_torchao_float8().precompute_float8_dynamic_scale_for_fsdp(model)


def describe(numerics: Numerics) -> str:
    """One line for the log."""
    master = f"{dtype_name(numerics.param_dtype)} master weights and optimizer states"
    if numerics.name == "fp8":
        compute = (
            f"FP8 {numerics.recipe} matmuls in large linear layers (torchao), "
            f"{dtype_name(numerics.compute_dtype)} autocast elsewhere"
        )
    elif numerics.name == "fp8-emulate":
        compute = f"FP8 {numerics.recipe} matmuls emulated in float32 (testing only, slow)"
    elif numerics.autocast:
        compute = f"{dtype_name(numerics.compute_dtype)} autocast compute"
    else:
        compute = f"{dtype_name(numerics.compute_dtype)} compute"
    return f"precision {numerics.name}: {master}, {compute}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def import_torchao_float8() -> ModuleType:
    """torchao.float8, imported lazily: only FP8 runs pay for it (or need it installed)."""
    try:
        import torchao.float8 as float8
    except ImportError as e:
        raise UserError(
            f"FP8 training needs torchao, which could not be imported ({e})",
            where=PRECISION_KEY,
            fix="pip install torchao, or use --precision bf16",
        ) from e
    return float8
