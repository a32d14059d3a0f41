"""The `hanlm` command's arguments: its subcommands and their flags.

A command's config flags (`--min-chars`, `--greedy`...) are not written here: CONFIG_FLAGS says
which config sections or keys each command exposes, and `hanlm.cli.config_flags` makes one flag per
key from the pydantic models (type, description, default). Only the arguments that are not
config keys (MODEL_DIR, --out, --force, --from...) are spelled out below.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hanlm import __version__
from hanlm.cli import config_flags
from hanlm.cli.commands import (
    DEFAULT_RUN,
    cmd_chat,
    cmd_decontam,
    cmd_demo,
    cmd_doctor,
    cmd_eval,
    cmd_export,
    cmd_facts,
    cmd_generate,
    cmd_launch,
    cmd_plan,
    cmd_preflight,
    cmd_pretrain,
    cmd_publish,
    cmd_rehearse,
    cmd_run,
    cmd_serve,
    cmd_sft,
    cmd_stage,
)

DESCRIPTION = """\
hanlm: from raw Korean text to an honestly evaluated small chat model.

Each stage reads what earlier stages wrote into the run directory (--run) and writes its own
outputs there atomically; a finished stage is skipped when run again with the same settings.
`hanlm run` runs every stage in order on the built-in demo recipe unless given --config.
"""

# The config keys each command takes as flags: a section name exposes each of its fields, a
# dotted key one field, and "-key" takes one out again. Every key stays reachable with --set.
# the data stages' engine: --executor, --workers (tasks at once), --task-mb
_DATA_ENGINE = ("data_engine.executor", "data_engine.workers", "data_engine.task_mb")
CONFIG_FLAGS: dict[str, tuple[str, ...]] = {
    "corpus": ("corpus", *_DATA_ENGINE),
    "decontam": ("decontam", *_DATA_ENGINE),
    "tokenizer": ("tokenizer",),
    "shards": ("shards", *_DATA_ENGINE),
    "pretrain": (
        "pretrain",
        "model",
        "optimizer",
        "precision",
        "parallel",
        "checkpoint",
        "logging",
    ),
    # SFT logs to [logging]'s trackers, at [sft.logging]'s cadence
    "sft": (
        "sft",
        "model.trust_remote_code",
        "logging.trackers",
        "logging.name",
        "logging.wandb",
        "logging.trackio",
    ),
    "eval": ("eval", "model.trust_remote_code"),
    "preflight": ("preflight",),
    "launch": ("launch", "plan.gpu", "plan.gpus", "plan.hosts", "plan.price_per_gpu_hour"),
    "generate": ("generate", "model.trust_remote_code"),
    "publish": ("publish",),
    # one conversation: nothing to batch
    "chat": ("generate", "-generate.batch_size", "model.trust_remote_code"),
    # the server's defaults; the engine batches and places the model itself
    "serve": (
        "generate",
        "-generate.batch_size",
        "-generate.device",
        "serve",
        "model.trust_remote_code",
    ),
    "plan": (
        "plan",
        "model.preset",
        "pretrain.seq_len",
        "pretrain.micro_batch",
        "pretrain.global_batch_tokens",
        "precision.mode",
        "parallel.mode",
        "parallel.activation_checkpointing",
        "tokenizer.vocab_size",
    ),
}


def _add_config_flags(command: argparse.ArgumentParser, name: str) -> None:
    """Give `command` the flags of the config keys CONFIG_FLAGS lists for `name`."""
    from hanlm.config import Config  # deferred: pydantic's models, ~0.1 s that --help spares

    config_flags.add_config_flags(command, Config, CONFIG_FLAGS[name])


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("run and configuration")
    group.add_argument(
        "--run",
        "--run-dir",
        dest="run",
        type=Path,
        default=Path(DEFAULT_RUN),
        metavar="DIR",
        # plain torchrun's parser takes a bare `--run` for its `--run-path` (hanlm torchrun's
        # does not): use --run-dir there
        help=f"run directory (default: {DEFAULT_RUN}); under plain torchrun write --run-dir",
    )
    group.add_argument(
        "--config",
        metavar="FILE|RECIPE",
        help="TOML recipe: a path or a built-in name such as `demo` "
        "(default: DIR/config.toml if present, else the demo recipe)",
    )
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set tokenizer.vocab_size=8192 (repeatable)",
    )


def _command(
    sub, name: str, help_text: str, description: str, *, force: str | None = None, run: bool = True
) -> argparse.ArgumentParser:
    """A subcommand: with the run and configuration options unless run=False, and --force
    with the given help when `force` is set."""
    parser = sub.add_parser(
        name,
        help=help_text,
        description=description,
        # a description with paragraphs or example lines is printed as written, else wrapped
        formatter_class=argparse.RawDescriptionHelpFormatter
        if "\n" in description
        else argparse.HelpFormatter,
    )
    if run:
        _common(parser)
    if force:
        parser.add_argument("--force", action="store_true", help=force)
    return parser


REDO = "redo the stage even if it is complete"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The arguments of `hanlm ARGV`, the named command's config flags among them."""
    return build_parser(_command_named(argv)).parse_args(argv)


def _command_named(argv: list[str]) -> str | None:
    """The command `argv` names (None for `hanlm --help`), read as the full parser reads it:
    the first positional argument, since the options before a command take no value."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("command", nargs="?")
    return first.parse_known_args(argv)[0].command


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `hanlm` parser, with the config flags of `command` alone: making a command's flags
    imports the pydantic models (~0.1 s), which `hanlm --help` does without."""
    parser = argparse.ArgumentParser(
        prog="hanlm", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hanlm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (_add_run, _add_rehearse, _add_data_stages, _add_pretrain, _add_export):
        add(sub)
    for add in (_add_preflight,):
        add(sub)
    for add in (_add_eval, _add_decontam, _add_generate, _add_chat, _add_serve, _add_sft):
        add(sub)
    for add in (_add_doctor, _add_plan, _add_launch, _add_demo, _add_publish, _add_facts):
        add(sub)
    for add in (_add_torchrun,):
        add(sub)
    if command in CONFIG_FLAGS:  # sub.choices: each command's parser, by name
        _add_config_flags(sub.choices[command], command)
    return parser


def _add_launch(sub) -> None:
    parser = _command(
        sub,
        "launch",
        "run the recipe on rented GPUs (SkyPilot) or a cluster (Slurm), priced first",
        "Price the recipe's plan on the hosts it names (plan.gpu, plan.gpus per host, "
        "plan.hosts), write the engine's job into DIR/launch/ (a SkyPilot task or an sbatch "
        "script), check it with the engine's own parser and submit it. On every host the job "
        "runs preflight first (a NO-GO host exits 69 and another is tried), then `hanlm run` "
        "under torchrun; a preempted run exits 75 and is resumed from its checkpoint.\n\n"
        "  hanlm launch --config ko-1.3b-8x5090 --run-dir runs/ko13b --spot \\\n"
        "      --bucket s3://my-runs --dry-run\n"
        "  hanlm launch --engine slurm --partition gpu --run-dir /shared/runs/ko13b\n"
        "  hanlm launch --status --run-dir runs/ko13b",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write and check everything, submit nothing (no network)",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="list the hosts tried (verdicts, GPU-hours, cost) against the launch's plan",
    )
    parser.add_argument("--json", action="store_true", help="also print the record as JSON")
    parser.set_defaults(func=cmd_launch)


def _add_torchrun(sub) -> None:
    parser = _command(
        sub,
        "torchrun",
        "torchrun, exiting with the ranks' status (75 stopped, 69 NO-GO, 2 your input)",
        "torchrun with its own options (torch.distributed.run), for launchers that act on the "
        "exit status: torchrun exits 1 whenever a rank fails, this exits 75 when the ranks "
        "stopped for a signal after their checkpoint (run again to continue), 69 when "
        "preflight rejected the hosts (try others), 2 for a user error, else 1.\n\n"
        "  hanlm torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\\n"
        "      --rdzv-endpoint HOST0:29500 --rdzv-id RUN -m hanlm run --run-dir DIR",
        run=False,
    )
    parser.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="TORCHRUN-ARGS")


def _add_run(sub) -> None:
    parser = _command(
        sub,
        "run",
        "run the whole pipeline (default: the demo recipe)",
        "Run every stage in order. Finished stages are skipped, so an "
        "interrupted run resumes where it stopped; --from STAGE redoes from a stage.",
    )
    parser.add_argument(
        "--from", dest="from_stage", metavar="STAGE", help="redo this stage and every later one"
    )
    parser.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. shards)")
    parser.set_defaults(func=cmd_run)


def _add_data_stages(sub) -> None:
    parser = _command(
        sub,
        "corpus",
        "read, normalise (NFC), clean and deduplicate raw text",
        "Read raw text, normalise it to Unicode NFC, remove control characters, drop "
        "short documents and duplicates, and write DIR/corpus/ (zstd JSONL parts and "
        "stats.json).\n\nInputs: .txt (one document per blank-line-separated block, or "
        "per line with --doc-per-line), .jsonl (--text-field), .parquet, each optionally "
        ".gz or .zst; hf:NAME[@REVISION][:CONFIG]:SPLIT (a local snapshot folder, or the Hub: "
        "parquet read by row group, other files streamed); "
        "`demo` for the built-in synthetic Korean world.",
        force=REDO,
    )
    parser.set_defaults(func=cmd_stage, stage="corpus")
    parser = _command(
        sub,
        "tokenizer",
        "train the byte-level BPE tokenizer on the corpus",
        "Train a byte-level BPE tokenizer (NFC, Qwen2's pre-tokenizer split, which llama.cpp "
        "implements: digits one by one; chat and "
        "document special tokens reserved) and write DIR/tokenizer/, loadable with "
        "transformers.AutoTokenizer, plus special_tokens.json and stats.json with the "
        "held-out characters and bytes per token.",
        force=REDO,
    )
    parser.set_defaults(func=cmd_stage, stage="tokenizer")
    parser = _command(
        sub,
        "shards",
        "tokenise the corpus into memmap token shards",
        "Tokenise the corpus on the data engine (one task per corpus part; [data_engine] "
        "executor local, slurm or ray) into DIR/shards/ (train-*.bin, val-*.bin as uint16 or "
        "uint32, manifest.json). A killed run resumes: it encodes only unfinished parts.",
        force=REDO,
    )
    parser.set_defaults(func=cmd_stage, stage="shards")


def _add_pretrain(sub) -> None:
    parser = _command(
        sub,
        "pretrain",
        "pretrain the model on the shards (alone or under torchrun)",
        "Pretrain a decoder LM from scratch on DIR/shards/: one explicit loop (AdamW, warm-up "
        "then cosine or WSD, clipping, accumulation to a global batch in tokens), bf16, fp8 or "
        "fp32, single process, DDP or FSDP2. Several processes:\n\n"
        "  torchrun --nproc_per_node 8 -m hanlm pretrain --run-dir DIR\n\n"
        "Writes DIR/pretrain/metrics.jsonl and checkpoints, and continues from the latest "
        "checkpoint unless --resume never.",
        force=REDO,
    )
    parser.add_argument(
        "--stop-after-steps",
        type=int,
        metavar="N",
        help="train N steps from where it starts or resumes, checkpoint and stop (exit 75); "
        "the same command continues",
    )
    parser.set_defaults(func=cmd_pretrain)


def _add_export(sub) -> None:
    parser = _command(
        sub,
        "export",
        "write a checkpoint as a Hugging Face model folder, or a model as GGUF",
        "Write a pretraining checkpoint (the latest committed one by default) as a plain\n"
        "Hugging Face folder: model.safetensors, config.json, generation_config.json and the\n"
        "tokenizer with its chat template. transformers, vLLM and lm-evaluation-harness load\n"
        "it as it is. Default output: DIR/pretrain/hf (the latest checkpoint); a step chosen\n"
        "with --checkpoint goes to DIR/pretrain/hf-step-NNNNNNNN, or --out.\n\n"
        "--format gguf writes an exported folder (DIR/sft/hf when there is one, else\n"
        "DIR/pretrain/hf, or --source) as one GGUF file for llama.cpp and Ollama, with an\n"
        "Ollama Modelfile next to it. Default output: DIR/gguf/{chat,base}-TYPE.gguf.\n"
        "Needs the `gguf` package: pip install 'hanlm[gguf]'.",
        force="redo the export even if it is complete; replace an earlier GGUF file",
    )
    parser.add_argument("--format", choices=("hf", "gguf"), default="hf", help="output format")
    parser.add_argument(
        "--checkpoint", metavar="STEP|PATH", help="a step number or a checkpoint folder"
    )
    parser.add_argument(
        "--out", type=Path, metavar="PATH", help="output folder (hf) or file NAME.gguf (gguf)"
    )
    parser.add_argument(
        "--gguf-type",
        default="f16",
        metavar="TYPE",
        help="GGUF weights: f16 (default), bf16, q8_0 or f32",
    )
    parser.add_argument(
        "--source", type=Path, metavar="DIR", help="gguf: the exported folder to convert"
    )
    parser.set_defaults(func=cmd_export, stage="export")


def _add_rehearse(sub) -> None:
    parser = _command(
        sub,
        "rehearse",
        "run every stage of the recipe on this host in minutes: ready or not, and the real cost",
        "Every stage the recipe runs, on this host, with its real shapes (model, sequence "
        "length, micro-batch, precision, parallelism over every rank, compile, optimizer, the "
        "SFT method, the eval tasks) and small budgets, in DIR/rehearsal/ (the run itself "
        "starts afterwards as if no rehearsal had happened). Pretraining is timed after its "
        "warm-up, its checkpoint written to the recipe's storage and mirror, stopped hard in "
        "a save and resumed; `hanlm serve` answers one request. Writes "
        "DIR/rehearsal/rehearsal.json: each stage's status, seconds and figures, the full run "
        "projected from the measured speeds beside the plan, and the verdict; `hanlm plan` "
        "then uses the measured tokens/s. Under torchrun every rank takes part, as in the run:\n\n"
        "  hanlm torchrun --nproc-per-node 8 -m hanlm rehearse --config ko-1.3b-8x5090 "
        "--run-dir runs/ko13b\n\n"
        "Exit status 0 ready, 69 the host is at fault (device, memory, storage, network), 2 the "
        "recipe or its inputs, 1 a bug.",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="also time the micro-batches, activation checkpointing and compile that fit, and "
        "print the --set line of the fastest",
    )
    parser.set_defaults(func=cmd_rehearse)


def _add_preflight(sub) -> None:
    parser = _command(
        sub,
        "preflight",
        "measure the hosts (devices, network, disk, data) and say GO or NO-GO",
        "Measure where training will run, with the same launcher:\n\n"
        "  torchrun --nproc_per_node N -m hanlm preflight --run-dir DIR\n\n"
        "Devices (memory, compute capability, FP8, driver, matmul against the catalogue peak), "
        "collectives (all-reduce, all-gather, reduce-scatter verified; bus bandwidth; "
        "communication per step of the planned model against compute), the checkpoint disk "
        "(fsync throughput and latency, read-back, free space, save time against the interval) "
        "and data loading from the shards. Writes DIR/preflight/preflight.json; exit status 0 for GO, "
        "69 for NO-GO (launchers take it as: give this host back, try another).",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the report as JSON on stdout"
    )
    parser.set_defaults(func=cmd_preflight)


def _add_eval(sub) -> None:
    parser = _command(
        sub,
        "eval",
        "evaluate models on hanlm's tasks, lm-eval's (KMMLU, HAE-RAE, CLIcK, ...) or your own",
        "Evaluate the run's model (DIR/sft/hf, else DIR/pretrain/hf) into DIR/eval/, or any "
        "Hugging Face model folders (--model, repeatable: side by side) into --out. Every score "
        "comes as full / clean / dirty when a decontamination report exists (--contamination, "
        "default DIR/decontam/items.jsonl). Writes results.json, samples.jsonl, results.md.\n\n"
        "Tasks: --tasks a,b or --task NAME (repeatable). hanlm's own: kobest_boolq, "
        "kobest_copa, kobest_hellaswag, kobest_sentineg, kobest_wic, gsm8k_ko, ifeval_ko, "
        "direction, demo_qa, as NAME, NAME=FILE or NAME=hf:DATASET[:CONFIG][:SPLIT]. Any task or "
        "group of lm-evaluation-harness's registry (kmmlu, haerae, click, kobest, ...; pip install "
        "'hanlm[lm-eval]'): NAME (from the Hub) or NAME=DIR (local copies, DIR/REPO as `hf "
        "download REPO --repo-type dataset --local-dir DIR/REPO` writes them). Your own: a task "
        "file, exam.toml or exam.yaml (kind = multiple_choice | generation, items = FILE.jsonl, "
        "fewshot_items, num_fewshot, fewshot_seed; generation: normalise, answer_regex, until, "
        "max_new_tokens).",
        force=REDO,
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: DIR/eval)")
    parser.set_defaults(func=cmd_eval, stage="eval")


def _add_decontam(sub) -> None:
    parser = _command(
        sub,
        "decontam",
        "find benchmark items in training data; report and remove them",
        "Build an index of benchmark items and scan training data for them: NFC, Latin "
        "lower-cased, punctuation and spaces removed, then 27-character n-grams (--ngram), so "
        "copies with other spacing or punctuation still match. Per item: coverage (the share of "
        "its n-grams found), status dirty/partial/clean, the documents holding it.\n\n"
        "  hanlm decontam --run DIR                  the stage between corpus and tokenizer: "
        "writes DIR/decontam/ with the decontaminated corpus\n"
        "  hanlm decontam --corpus 'sft/*.jsonl' --out DIR --benchmark kobest_boolq=dev.tsv\n"
        "                                            any training data: .txt, JSONL, chat JSONL "
        "(every message counts), .gz/.zst\n"
        "  ... --shard I/N, then hanlm decontam merge --out DIR (or --run DIR)\n"
        "                                            several machines, one slice each\n\n"
        "Benchmarks (TASK=PATH): kobest_boolq, kobest_copa, kobest_hellaswag, kobest_sentineg, "
        "kobest_wic (KoBEST TSV or skt/kobest_v1 files), gsm8k_ko, ifeval_ko, demo_qa, jsonl.",
        force=REDO,
    )
    parser.add_argument("merge", nargs="?", choices=["merge"], help="combine the shards' results")
    parser.add_argument(
        "--corpus", action="append", metavar="GLOB", help="training data (repeatable)"
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="standalone: results in DIR/decontam/"
    )
    parser.add_argument("--shard", metavar="I/N", help="scan slice I of N (0-based)")
    parser.set_defaults(func=cmd_decontam)


MODEL_DIR_HELP = "Hugging Face model folder"


def _add_generate(sub) -> None:
    parser = _command(
        sub,
        "generate",
        "generate answers from a model folder (prompts from arguments or a file)",
        "Generate from any Hugging Face causal LM folder (e.g. DIR/pretrain/hf): "
        "greedy or sampled, with repetition control that spares special tokens. Prompts come "
        'from --prompt (repeatable) or --prompts FILE (.jsonl rows with "prompt" or '
        '"messages", else one per line); answers print to stdout and, with --out, go to a '
        "JSONL file. Defaults come from the config's [generate] section.",
        force="replace an earlier results file at --out",
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help=MODEL_DIR_HELP)
    parser.add_argument(
        "--prompt", dest="prompt_texts", action="append", metavar="TEXT", help="(repeatable)"
    )
    parser.add_argument(
        "--prompts", dest="prompts_file", type=Path, metavar="FILE", help=".jsonl or .txt"
    )
    parser.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn")
    parser.add_argument("--out", type=Path, metavar="FILE.jsonl", help="also write results here")
    parser.set_defaults(func=cmd_generate)


def _add_chat(sub) -> None:
    parser = _command(
        sub,
        "chat",
        "talk to a model folder in the terminal",
        "Interactive chat through the model's chat template; answers stream as "
        "they are written. /reset forgets the conversation, /exit or Ctrl-D quits, Ctrl-C "
        "stops an answer.",
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help=MODEL_DIR_HELP)
    parser.add_argument(
        "--system", metavar="TEXT", help="system message that opens the conversation"
    )
    parser.set_defaults(func=cmd_chat)


def _add_serve(sub) -> None:
    parser = _command(
        sub,
        "serve",
        "serve a model behind an OpenAI-compatible API, with a chat page",
        "Serve a run's model (its chat model, else its base model), an exported model folder, "
        "a Hub id or a GGUF file: /v1/models, /v1/completions and /v1/chat/completions "
        "(streamed or not) for OpenAI clients, and a chat page at /. The engine is llama.cpp "
        "(llama-cpp-python, CPU or GPU: the run's GGUF, written when missing) or, with "
        "--engine vllm, vLLM on a CUDA host. Requests that leave out a sampling setting get the "
        "config's [generate] value (a run's own when serving a run). It listens on 127.0.0.1; "
        "another address needs an API key. Ctrl-C or SIGTERM stops it.",
    )
    parser.add_argument(
        "target", metavar="RUN|MODEL_DIR|FILE.gguf", help="what to serve (or a Hub id org/name)"
    )
    parser.add_argument(
        "--engine", default="llama.cpp", metavar="NAME", help="llama.cpp (default) or vllm"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)"
    )
    parser.add_argument(
        "--api-key", metavar="KEY", help="clients must send it (default: $HANLM_API_KEY)"
    )
    parser.add_argument(
        "--gguf-type",
        default="f16",
        metavar="TYPE",
        help="GGUF written for llama.cpp when a folder is served: f32, f16 (default), bf16, q8_0",
    )
    parser.add_argument("--threads", type=int, metavar="N", help="llama.cpp's CPU threads")
    parser.set_defaults(func=cmd_serve)


def _add_sft(sub) -> None:
    parser = _command(
        sub,
        "sft",
        "chat fine-tuning: special-token audit and init, then the closure check",
        "Fine-tune the run's pretrained model (or --model HF_DIR) on chat conversations "
        "(--data messages JSONL; default DIR/demo/chat.jsonl), loss on assistant tokens and "
        "each turn's <|eot|>. Before training: the benchmark check and the special-token audit "
        "(DIR/sft/audit.json), untrained template tokens initialised (--init). Every weight "
        "trains, or with --method lora PEFT's LoRA adapters and the chat tokens' rows alone. "
        "After: export to DIR/sft/hf (LoRA merged, its adapter in hf/adapter/) and the closure "
        "check on held-out prompts (DIR/sft/closure.json).",
        force=REDO,
    )
    parser.set_defaults(func=cmd_sft)


def _add_doctor(sub) -> None:
    parser = _command(
        sub,
        "doctor",
        "check a chat model folder for what keeps it from ending its answers",
        "Check any Hugging Face causal LM folder: under-trained end tokens, the "
        "chat template against the tokenizer, padding against end tokens, generation_config "
        "eos against the template's end-of-turn. Exit 1 when something is wrong.",
        run=False,
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    parser.add_argument("--json", action="store_true", help="also print the findings as JSON")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the Python code the folder names in its auto_map (model.trust_remote_code)",
    )
    parser.set_defaults(func=cmd_doctor)


def _add_plan(sub) -> None:
    parser = _command(
        sub,
        "plan",
        "memory, time and cost of pretraining on given GPUs, before renting them",
        "Estimate per-GPU memory (itemised), step time, GPU-hours, wall time and "
        "cost of the recipe's pretraining on the given hardware, and recommend the cheapest "
        "configuration that fits. Without --gpu, compare every GPU of the catalogue. Without "
        "--config (and outside a run directory with a config.toml) it starts from the "
        "documented defaults, not the demo recipe.\n\n"
        "  hanlm plan --preset 1.3b --seq-len 2048 --micro-batch 2 --gpu rtx5090 --gpus 8 \\\n"
        "             --tokens 22e9 --price-per-gpu-hour 0.40",
        force="replace an earlier plan at --out",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the plan as JSON here")
    # a run's config.toml is read only when --run is given: plan is mostly used before a run
    parser.set_defaults(run=None, func=cmd_plan)


def _add_demo(sub) -> None:
    parser = _command(
        sub,
        "demo",
        "write the built-in synthetic Korean world to a folder",
        "Write the demo world (pretraining documents, two-choice benchmark "
        "with its planted subset, chat conversations, facts table) to --out.",
        run=False,
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size-mb", type=float, default=4.0)
    parser.add_argument(
        "--force", action="store_true", help="replace an earlier demo world in --out"
    )
    parser.set_defaults(func=cmd_demo)


def _add_publish(sub) -> None:
    parser = _command(
        sub,
        "publish",
        "upload the run's model to the Hugging Face Hub with a card built from the run",
        "Write the run's chat model (RUN/sft/hf; the base model RUN/pretrain/hf when there is no "
        "chat model, or with --model base) with a model card built from the run into "
        "RUN/publish/ (or --out), then upload it to the Hub repository --repo. The card holds "
        "every eval score as full / clean / dirty beside the decontamination summary (Hub "
        "metadata and model-index), the recipe, hardware and cost, the report card with its "
        "figures, and how to run the model. Log in first: `hf auth login` or HF_TOKEN.\n\n"
        "  hanlm publish runs/ko13b --repo my-org/ko-small-chat --dry-run   look first\n"
        "  hanlm publish runs/ko13b --repo my-org/ko-small-chat --gguf model-f16.gguf",
        force="replace an earlier folder at --out",
        run=False,
    )
    parser.add_argument("run", type=Path, metavar="RUN", help="the run directory")
    parser.add_argument("--repo", metavar="NAME", help="Hub repository: NAME (yours) or OWNER/NAME")
    parser.add_argument(
        "--model",
        choices=["chat", "base"],
        help="which export (default: chat when the run has one, else base)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="write the folder only; no network, no token"
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="the folder (default: RUN/publish)")
    parser.add_argument("--gguf", type=Path, metavar="FILE", help="also upload this GGUF file")
    parser.set_defaults(func=cmd_publish)


def _add_facts(sub) -> None:
    parser = _command(
        sub,
        "facts",
        "write a facts table as training documents stating each fact both ways",
        "Read a facts table (TSV with columns subject, relation, object, or JSONL with those "
        "keys) and write JSONL documents that state each fact subject first and, for a seeded "
        "--reverse-share of them, object first too; add the file to corpus.inputs. "
        "--probe-table writes the table for `hanlm eval --task direction=FILE`, which then "
        "compares the facts with and without reverse statements. See docs/facts.md.",
        force="replace existing output files",
        run=False,
    )
    parser.add_argument("table", type=Path, metavar="TABLE")
    parser.add_argument("--out", type=Path, required=True, metavar="DOCS.jsonl")
    parser.add_argument("--probe-table", type=Path, metavar="FILE.tsv")
    parser.add_argument(
        "--templates", type=Path, metavar="FILE.toml", help="sentences per relation"
    )
    parser.add_argument("--reverse-share", type=float, default=1.0, metavar="SHARE")
    parser.add_argument("--copies", type=int, default=1, help="documents per fact")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=cmd_facts)
