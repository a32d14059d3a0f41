"""The `hanlm` command: parse, load the configuration, call the stage. Nothing else."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hanlm import __version__
from hanlm.errors import UserError
from hanlm.files import check_folder_path, claim_output_dir, claim_output_file, read_json

DEFAULT_RUN = "runs/demo"

DESCRIPTION = """\
hanlm: from raw Korean text to an honestly evaluated small chat model.

Each stage reads what earlier stages wrote into the run directory (--run) and writes its own
outputs there atomically; a finished stage is skipped when run again with the same settings.
`hanlm run` runs every stage in order on the built-in demo recipe unless given --config.
"""


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run and configuration")
    g.add_argument(
        "--run",
        "--run-dir",
        dest="run",
        type=Path,
        default=Path(DEFAULT_RUN),
        metavar="DIR",
        # torchrun's own parser takes a bare `--run` for its `--run-path`: use --run-dir there
        help=f"run directory (default: {DEFAULT_RUN}); under torchrun write --run-dir",
    )
    g.add_argument(
        "--config",
        metavar="FILE|RECIPE",
        help="TOML recipe: a path or a built-in name such as `demo` "
        "(default: DIR/config.toml if present, else the demo recipe)",
    )
    g.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set tokenizer.vocab_size=8192 (repeatable)",
    )


def _stage_parser(sub, name: str, help_text: str, description: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=help_text,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--force", action="store_true", help="redo the stage even if it is complete")
    return p


DECODING_FLAGS = {
    "max_new_tokens": "generate.max_new_tokens",
    "greedy": "generate.greedy",
    "temperature": "generate.temperature",
    "top_k": "generate.top_k",
    "top_p": "generate.top_p",
    "repetition_penalty": "generate.repetition_penalty",
    "no_repeat_ngram_size": "generate.no_repeat_ngram_size",
    "frequency_penalty": "generate.frequency_penalty",
    "presence_penalty": "generate.presence_penalty",
    "seed": "generate.seed",
    "device": "generate.device",
}


def _decoding_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    g = p.add_argument_group("decoding (defaults: the config's [generate] section)")
    g.add_argument("--max-new-tokens", type=int, metavar="N")
    g.add_argument("--greedy", action="store_true", default=None, help="no sampling")
    g.add_argument("--temperature", type=float, metavar="T")
    g.add_argument("--top-k", type=int, metavar="K", help="0 = no top-k cut")
    g.add_argument("--top-p", type=float, metavar="P", help="1 = no nucleus cut")
    g.add_argument("--repetition-penalty", type=float, metavar="R", help="CTRL rule; 1 = off")
    g.add_argument("--no-repeat-ngram-size", type=int, metavar="N", help="0 = off")
    g.add_argument("--frequency-penalty", type=float, metavar="F")
    g.add_argument("--presence-penalty", type=float, metavar="P")
    g.add_argument("--seed", type=int, metavar="S")
    g.add_argument("--device", help="auto, cpu, cuda or cuda:N")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hanlm", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hanlm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "run",
        help="run the whole pipeline (default: the demo recipe)",
        description="Run every stage in order. Finished stages are skipped, so an "
        "interrupted run resumes where it stopped; --from STAGE redoes from a stage.",
    )
    _common(p)
    p.add_argument(
        "--from", dest="from_stage", metavar="STAGE", help="redo this stage and every later one"
    )
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. shards)")
    p.set_defaults(func=_cmd_run)

    p = _stage_parser(
        sub,
        "corpus",
        "read, normalise (NFC), clean and deduplicate raw text",
        "Read raw text, normalise it to Unicode NFC, remove control characters, drop "
        "short documents and duplicates, and write DIR/corpus/ (zstd JSONL parts and "
        "stats.json).\n\nInputs: .txt (one document per blank-line-separated block, or "
        "per line with --doc-per-line), .jsonl (--text-field), .parquet, each optionally "
        ".gz or .zst; hf:NAME[:CONFIG]:SPLIT (streamed with `datasets`, needs network); "
        "`demo` for the built-in synthetic Korean world.",
    )
    p.add_argument(
        "--input",
        dest="inputs",
        action="append",
        metavar="GLOB",
        help="input file glob, hf:NAME[:CONFIG]:SPLIT or demo (repeatable)",
    )
    p.add_argument("--text-field", help="JSONL/parquet field holding the text (default: text)")
    p.add_argument(
        "--doc-per-line", action="store_true", default=None, help=".txt: one document per line"
    )
    p.add_argument("--min-chars", type=int, help="drop documents shorter than this")
    p.add_argument(
        "--near-dedup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also remove near-duplicates with MinHash LSH",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        default=None,
        help="fail on the first corrupt record instead of skipping and counting it",
    )
    p.set_defaults(
        func=_cmd_stage,
        stage="corpus",
        flags={
            "inputs": "corpus.inputs",
            "text_field": "corpus.text_field",
            "doc_per_line": "corpus.doc_per_line",
            "min_chars": "corpus.min_chars",
            "near_dedup": "corpus.near_dedup",
            "strict": "corpus.strict",
        },
    )

    p = _stage_parser(
        sub,
        "tokenizer",
        "train the byte-level BPE tokenizer on the corpus",
        "Train a byte-level BPE tokenizer (NFC, digits split one by one, chat and "
        "document special tokens reserved) and write DIR/tokenizer/, loadable with "
        "transformers.AutoTokenizer, plus special_tokens.json and stats.json with the "
        "held-out characters and bytes per token.",
    )
    p.add_argument("--vocab-size", type=int, help="vocabulary size (padded to a multiple of 64)")
    p.add_argument("--sample-chars", type=int, help="characters of corpus to train on")
    p.set_defaults(
        func=_cmd_stage,
        stage="tokenizer",
        flags={"vocab_size": "tokenizer.vocab_size", "sample_chars": "tokenizer.sample_chars"},
    )

    p = _stage_parser(
        sub,
        "shards",
        "tokenise the corpus into memmap token shards",
        "Tokenise the corpus in worker processes into DIR/shards/ (train-*.bin, "
        "val-*.bin as uint16 or uint32, manifest.json). A re-run skips finished parts.",
    )
    p.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    p.add_argument("--val-fraction", type=float, help="share of documents held out for validation")
    p.set_defaults(
        func=_cmd_stage,
        stage="shards",
        flags={"workers": "shards.workers", "val_fraction": "shards.val_fraction"},
    )

    p = _stage_parser(
        sub,
        "pretrain",
        "pretrain the model on the shards (alone or under torchrun)",
        "Pretrain a decoder LM from scratch on DIR/shards/: one explicit loop (AdamW, warm-up "
        "then cosine or WSD, clipping, accumulation to a global batch in tokens), bf16, fp8 or "
        "fp32, single process, DDP or FSDP2. Several processes:\n\n"
        "  torchrun --nproc_per_node 8 -m hanlm pretrain --run DIR\n\n"
        "Writes DIR/pretrain/metrics.jsonl and checkpoints, and continues from the latest "
        "checkpoint unless --resume never.",
    )
    p.add_argument("--preset", help="model preset (tiny, demo, 125m, 350m, 1.3b) or a config.json")
    p.add_argument("--max-steps", type=int, help="optimizer steps")
    p.add_argument("--max-tokens", type=int, help="training tokens (rounded up to whole steps)")
    p.add_argument("--precision", help="fp32, bf16, fp8 or fp8-emulate (fp4 is refused)")
    p.add_argument("--parallel", help="auto, single, ddp or fsdp")
    p.add_argument("--resume", help="auto (from the latest checkpoint) or never")
    p.set_defaults(
        func=_cmd_stage,
        stage="pretrain",
        flags={
            "preset": "model.preset",
            "max_steps": "pretrain.max_steps",
            "max_tokens": "pretrain.max_tokens",
            "precision": "precision.mode",
            "parallel": "parallel.mode",
            "resume": "checkpoint.resume",
        },
    )

    p = _stage_parser(
        sub,
        "export",
        "write a checkpoint as a Hugging Face model folder",
        "Write a pretraining checkpoint (the latest committed one by default) as a plain Hugging "
        "Face folder: model.safetensors, config.json, generation_config.json and the tokenizer "
        "with its chat template. transformers, vLLM, llama.cpp's converter and "
        "lm-evaluation-harness load it as it is. Default output: DIR/pretrain/hf.",
    )
    p.add_argument("--checkpoint", metavar="STEP|PATH", help="a step number or a checkpoint folder")
    p.add_argument("--out", type=Path, metavar="DIR", help="output folder")
    p.set_defaults(func=_cmd_export, stage="export", flags={})

    p = sub.add_parser(
        "preflight",
        help="measure the hosts (devices, network, disk, data) and say GO or NO-GO",
        description="Measure where training will run, with the same launcher:\n\n"
        "  torchrun --nproc_per_node N -m hanlm preflight --run-dir DIR\n\n"
        "Devices (memory, compute capability, FP8, driver, matmul against the catalogue peak), "
        "collectives (all-reduce, all-gather, reduce-scatter verified; bus bandwidth; "
        "communication per step of the planned model against compute), the checkpoint disk "
        "(fsync throughput and latency, read-back, free space, save time against the interval) "
        "and data loading from the shards. Writes DIR/preflight.json; exit status 0 for GO, "
        "1 for NO-GO.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument(
        "--checkpoint-dir", metavar="DIR", help="folder to test (default: RUN/pretrain/checkpoints)"
    )
    p.add_argument("--timeout", type=float, metavar="S", help="rendezvous and collective timeout")
    p.add_argument("--json", action="store_true", help="also print the report as JSON on stdout")
    p.set_defaults(
        func=_cmd_preflight,
        flags={"checkpoint_dir": "preflight.checkpoint_dir", "timeout": "preflight.timeout_s"},
    )

    p = _stage_parser(
        sub,
        "eval",
        "evaluate models on KoBEST, GSM8K-ko, IFEval-ko, the direction probe and demo_qa",
        "Evaluate the run's model (DIR/sft/hf, else DIR/pretrain/hf) into DIR/eval/, or any "
        "Hugging Face model folders (--model, repeatable: side by side) into --out. Every score "
        "comes as full / clean / dirty when a decontamination report exists (--contamination, "
        "default DIR/decontam/items.jsonl). Writes results.json, samples.jsonl, results.md.\n\n"
        "Tasks: --task NAME or NAME=PATH (a local file) or NAME=hf:DATASET[:CONFIG][:SPLIT]; "
        "NAME one of kobest_boolq, kobest_copa, kobest_hellaswag, kobest_sentineg, kobest_wic, "
        "gsm8k_ko, ifeval_ko, direction, demo_qa.",
    )
    p.add_argument("--model", dest="models", action="append", metavar="DIR", help="model folder")
    p.add_argument("--task", dest="tasks", action="append", metavar="NAME[=PATH]", help="task")
    p.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: DIR/eval)")
    p.add_argument("--contamination", metavar="PATH", help="decontam items.jsonl")
    p.add_argument("--limit", type=int, help="first N items of each task")
    p.add_argument("--batch-size", type=int, help="sequences per forward pass")
    p.add_argument("--dtype", help="fp32 or bf16")
    p.add_argument("--device", help="auto, cpu or cuda")
    p.add_argument("--num-fewshot", type=int, help="gsm8k_ko: worked examples in the prompt")
    p.add_argument("--max-new-tokens", type=int, help="generation tasks: token limit")
    p.set_defaults(
        func=_cmd_eval,
        stage="eval",
        flags={
            "models": "eval.models",
            "tasks": "eval.tasks",
            "contamination": "eval.contamination",
            "limit": "eval.limit",
            "batch_size": "eval.batch_size",
            "dtype": "eval.dtype",
            "device": "eval.device",
            "num_fewshot": "eval.num_fewshot",
            "max_new_tokens": "eval.max_new_tokens",
        },
    )

    p = _stage_parser(
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
    )
    p.add_argument("merge", nargs="?", choices=["merge"], help="combine the shards' results")
    p.add_argument("--corpus", action="append", metavar="GLOB", help="training data (repeatable)")
    p.add_argument("--out", type=Path, metavar="DIR", help="standalone: results in DIR/decontam/")
    p.add_argument(
        "--benchmark", dest="benchmarks", action="append", metavar="TASK=PATH", help="repeatable"
    )
    p.add_argument("--shard", metavar="I/N", help="scan slice I of N (0-based)")
    p.add_argument("--ngram", type=int, help="characters per n-gram (default 27)")
    p.add_argument("--action", choices=["drop", "cut", "keep"], help="what to do with matches")
    p.add_argument("--workers", type=int, help="scan processes (default: one per core)")
    p.add_argument("--text-field", help="JSONL field holding the text (default: text)")
    p.set_defaults(
        func=_cmd_decontam,
        flags={
            "benchmarks": "decontam.benchmarks",
            "ngram": "decontam.ngram",
            "action": "decontam.action",
            "workers": "decontam.workers",
            "text_field": "decontam.text_field",
        },
    )

    p = sub.add_parser(
        "generate",
        help="generate answers from a model folder (prompts from arguments or a file)",
        description="Generate from any Hugging Face causal LM folder (e.g. DIR/pretrain/hf): "
        "greedy or sampled, with repetition control that spares special tokens. Prompts come "
        'from --prompt (repeatable) or --prompts FILE (.jsonl rows with "prompt" or '
        '"messages", else one per line); answers print to stdout and, with --out, go to a '
        "JSONL file. Defaults come from the config's [generate] section.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="Hugging Face model folder")
    p.add_argument(
        "--prompt", dest="prompt_texts", action="append", metavar="TEXT", help="(repeatable)"
    )
    p.add_argument(
        "--prompts", dest="prompts_file", type=Path, metavar="FILE", help=".jsonl or .txt"
    )
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn")
    p.add_argument("--out", type=Path, metavar="FILE.jsonl", help="also write results here")
    p.add_argument("--force", action="store_true", help="replace an earlier results file at --out")
    _decoding_flags(p)
    p.add_argument("--batch-size", type=int, metavar="B", help="prompts decoded together")
    p.set_defaults(
        func=_cmd_generate, flags={**DECODING_FLAGS, "batch_size": "generate.batch_size"}
    )

    p = sub.add_parser(
        "chat",
        help="talk to a model folder in the terminal",
        description="Interactive chat through the model's chat template; answers stream as "
        "they are written. /reset forgets the conversation, /exit or Ctrl-D quits, Ctrl-C "
        "stops an answer.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="Hugging Face model folder")
    p.add_argument("--system", metavar="TEXT", help="system message that opens the conversation")
    _decoding_flags(p)
    p.set_defaults(func=_cmd_chat, flags=DECODING_FLAGS)

    p = _stage_parser(
        sub,
        "sft",
        "chat fine-tuning: special-token audit and init, then the closure check",
        "Fine-tune the run's pretrained model (or --model HF_DIR) on chat conversations "
        "(--data messages JSONL; default DIR/demo/chat.jsonl), loss on assistant tokens and "
        "each turn's <|eot|>. Before training: the benchmark check and the special-token audit "
        "(DIR/sft/audit.json), untrained template tokens initialised (--init). After: export to "
        "DIR/sft/hf and the closure check on held-out prompts (DIR/sft/closure.json).",
    )
    p.add_argument("--model", metavar="HF_DIR", help="fine-tune this exported model folder")
    p.add_argument("--data", metavar="JSONL", help="messages JSONL (system/user/assistant)")
    p.add_argument("--init", help="mean, mean-cov, text or none (untrained template tokens)")
    p.add_argument("--max-steps", type=int, help="optimizer steps")
    p.add_argument("--resume", help="auto (from the latest SFT checkpoint) or never")
    p.set_defaults(
        func=_cmd_sft,
        flags={
            "model": "sft.model",
            "data": "sft.data",
            "init": "sft.init",
            "max_steps": "sft.max_steps",
            "resume": "sft.checkpoint.resume",
        },
    )

    p = sub.add_parser(
        "doctor",
        help="check a chat model folder for what keeps it from ending its answers",
        description="Check any Hugging Face causal LM folder: under-trained end tokens, the "
        "chat template against the tokenizer, padding against end tokens, generation_config "
        "eos against the template's end-of-turn. Exit 1 when something is wrong.",
    )
    p.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    p.add_argument("--json", action="store_true", help="also print the findings as JSON")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser(
        "plan",
        help="memory, time and cost of pretraining on given GPUs, before renting them",
        description="Estimate per-GPU memory (itemised), step time, GPU-hours, wall time and "
        "cost of the recipe's pretraining on the given hardware, and recommend the cheapest "
        "configuration that fits. Without --gpu, compare every GPU of the catalogue. Without "
        "--config (and outside a run directory with a config.toml) it starts from the "
        "documented defaults, not the demo recipe.\n\n"
        "  hanlm plan --preset 1.3b --seq-len 2048 --micro-batch 2 --gpu rtx5090 --gpus 8 \\\n"
        "             --tokens 22e9 --price-per-gpu-hour 0.40",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--preset", help="model preset (tiny, demo, 125m, 350m, 1.3b)")
    p.add_argument("--model-config", dest="preset", help="path of a transformers config.json")
    p.add_argument("--vocab-size", type=int, help="tokenizer vocabulary (default 65,536)")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--micro-batch", type=int, help="sequences per GPU per forward/backward")
    p.add_argument("--global-batch-tokens", type=int, help="tokens per optimizer step")
    p.add_argument("--gpu", help="catalogue GPU name, or cpu")
    p.add_argument("--gpus", type=int, help="GPUs per host")
    p.add_argument("--hosts", type=int)
    p.add_argument("--precision", help="fp32, bf16 or fp8")
    p.add_argument("--parallel", help="single, ddp or fsdp")
    p.add_argument(
        "--activation-checkpointing",
        nargs="?",
        const="full",
        metavar="none|selective|full",
        help="recompute activations in backward (alone: full)",
    )
    p.add_argument("--tokens", type=float, help="training tokens, e.g. 22e9")
    p.add_argument("--price-per-gpu-hour", type=float, metavar="USD")
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation (default: typical per GPU)")
    p.add_argument("--inter-host-gbps", type=float, help="network between hosts, Gbit/s")
    p.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    p.add_argument("--out", type=Path, metavar="FILE", help="also write the plan as JSON here")
    p.add_argument("--force", action="store_true", help="replace an earlier plan at --out")
    # a run's config.toml is read only when --run is given: plan is mostly used before a run
    p.set_defaults(
        run=None,
        func=_cmd_plan,
        flags={
            "preset": "model.preset",
            "vocab_size": "tokenizer.vocab_size",
            "seq_len": "pretrain.seq_len",
            "micro_batch": "pretrain.micro_batch",
            "global_batch_tokens": "pretrain.global_batch_tokens",
            "precision": "precision.mode",
            "parallel": "parallel.mode",
            "activation_checkpointing": "parallel.activation_checkpointing",
            "gpu": "plan.gpu",
            "gpus": "plan.gpus",
            "hosts": "plan.hosts",
            "tokens": "plan.tokens",
            "price_per_gpu_hour": "plan.price_per_gpu_hour",
            "mfu": "plan.mfu",
            "inter_host_gbps": "plan.inter_host_gbps",
        },
    )

    p = sub.add_parser(
        "demo",
        help="write the built-in synthetic Korean world to a folder",
        description="Write the demo world (pretraining documents, yes/no benchmark "
        "with its planted subset, chat conversations, facts table) to --out.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size-mb", type=float, default=4.0)
    p.add_argument("--force", action="store_true", help="replace an earlier demo world in --out")
    p.set_defaults(func=_cmd_demo)
    return parser


def _flag_values(args: argparse.Namespace) -> dict[str, Any]:
    return {
        key: getattr(args, attr)
        for attr, key in getattr(args, "flags", {}).items()
        if getattr(args, attr, None) is not None
    }


def _load(args: argparse.Namespace):
    from hanlm.config import load_config

    values = _flag_values(args)
    if getattr(args, "max_tokens", None) is not None and getattr(args, "max_steps", None) is None:
        values["pretrain.max_steps"] = None  # --max-tokens replaces the recipe's max_steps
    return load_config(args.config, args.overrides, args.run, values=values)


def _cmd_stage(args: argparse.Namespace) -> int:
    from hanlm.pipeline import run_stage

    run_stage(args.stage, _load(args), args.run, force=args.force)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from hanlm.config import save_config
    from hanlm.stages import export

    cfg = _load(args)
    export.run(cfg, args.run, force=args.force, checkpoint=args.checkpoint, out=args.out)
    save_config(cfg, args.run)
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from hanlm.config import save_config
    from hanlm.stages import sft

    cfg = _load(args)
    sft.run(cfg, args.run, force=args.force)
    save_config(cfg, args.run)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from hanlm.chat import doctor

    report = doctor.diagnose(args.model_dir)
    doctor.print_report(report)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    return 0 if report["healthy"] else 1


def _cmd_run(args: argparse.Namespace) -> int:
    from hanlm.pipeline import run_pipeline

    run_pipeline(_load(args), args.run, from_stage=args.from_stage, until=args.until)
    return 0


def _cmd_preflight(args: argparse.Namespace) -> int:
    import json
    import os

    from hanlm.stages import preflight

    report = preflight.check(_load(args), args.run)
    if args.json and os.environ.get("RANK", "0") == "0":
        print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if report["verdict"] == "GO" else 1


def _cmd_eval(args: argparse.Namespace) -> int:
    from hanlm.evals import run as eval_run
    from hanlm.stages import eval as eval_stage

    cfg = _load(args)
    if args.out is None:
        from hanlm.config import save_config

        eval_stage.run(cfg, args.run, force=args.force)
        save_config(cfg, args.run)
        return 0
    in_run = args.run.is_dir()  # a run's demo world and decontam report serve as defaults
    models = cfg.eval.models or eval_stage.default_models(args.run)
    eval_run.evaluate(
        models,
        cfg.eval.tasks,
        args.out,
        demo_files=eval_stage.demo_files(args.run) if in_run else None,
        contamination=cfg.eval.contamination
        or (eval_stage.default_contamination(args.run) if in_run else None),
        options=eval_run.options_from(cfg),
        batch_size=cfg.eval.batch_size,
        dtype=cfg.eval.dtype,
        device=cfg.eval.device,
        replace_earlier=args.force,
    )
    return 0


def _cmd_decontam(args: argparse.Namespace) -> int:
    from hanlm.config import load_config, save_config
    from hanlm.data.decontam.scan import parse_shard
    from hanlm.stages import decontam

    standalone = args.out is not None
    if standalone and args.corpus is None and not args.merge:
        raise UserError("--out needs --corpus GLOB", fix="or scan a run's corpus with --run DIR")
    if args.corpus is not None and not standalone:
        raise UserError("--corpus needs --out DIR", fix="pass --out DIR for the results")
    if standalone:  # the results go to OUT/decontam/: refuse what is in the way before scanning
        check_folder_path(args.out, "--out")
        claim_output_dir(args.out / decontam.STAGE, name="the results folder")
    run_dir = None if standalone else args.run
    cfg = load_config(args.config, args.overrides, run_dir, values=_flag_values(args))
    shard = parse_shard(args.shard)
    if args.merge:
        decontam.merge(cfg, out_dir=args.out, run_dir=run_dir)
    elif standalone:
        decontam.standalone(cfg, args.corpus, args.out, force=args.force, shard=shard)
    else:
        decontam.run(cfg, run_dir, force=args.force, shard=shard)
    if run_dir is not None:
        save_config(cfg, run_dir)
    return 0


def _decoding_settings(args: argparse.Namespace):
    if args.greedy and any(getattr(args, a) is not None for a in ("temperature", "top_k", "top_p")):
        raise UserError(
            "--greedy takes no --temperature, --top-k or --top-p",
            fix="drop --greedy to sample, or drop the sampling flags",
        )
    return _load(args).generate


def _cmd_generate(args: argparse.Namespace) -> int:
    from hanlm.generate import read_prompts, write_results
    from hanlm.inference import generate, load  # deferred: torch and transformers

    if bool(args.prompt_texts) == bool(args.prompts_file):
        raise UserError("give prompts with --prompt TEXT (repeatable) or --prompts FILE, not both")
    if args.out is not None:  # before the model loads: a refusal costs nothing
        claim_output_file(
            args.out,
            is_earlier_output=_is_generate_output,
            replace_earlier=args.force,
            name="--out",
        )
    settings = _decoding_settings(args)
    prompts = args.prompt_texts or read_prompts(args.prompts_file)
    results = generate(load(args.model_dir, settings.device), prompts, settings, chat=args.chat)
    for i, result in enumerate(results):
        if len(results) > 1:
            print(f"--- {i + 1}/{len(results)}", flush=True)
        print(result["text"], flush=True)
    if args.out is not None:
        write_results(args.out, results)
    return 0


def _is_generate_output(path: Path) -> bool:
    """Whether `path` is a results file `hanlm generate --out` wrote: JSON rows with a prompt
    and a text each."""
    import json

    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines]
    except (OSError, ValueError):
        return False
    return bool(rows) and all(isinstance(r, dict) and {"prompt", "text"} <= r.keys() for r in rows)


def _is_plan_output(path: Path) -> bool:
    """Whether `path` is a plan `hanlm plan --out` wrote."""
    try:
        plan = read_json(path)
    except (OSError, ValueError):
        return False
    return isinstance(plan, dict) and {"setup", "model", "memory", "time"} <= plan.keys()


def _cmd_chat(args: argparse.Namespace) -> int:
    from hanlm.chat.session import run_repl
    from hanlm.inference import load

    settings = _decoding_settings(args)
    return run_repl(load(args.model_dir, settings.device), settings, system=args.system)


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from hanlm.config import load_config
    from hanlm.files import atomic_write_json
    from hanlm.plan import estimate as plan
    from hanlm.plan.table import print_plan

    values = _flag_values(args)
    cfg = load_config(args.config, args.overrides, args.run, values=values, recipe_fallback=False)
    if args.out is not None:
        claim_output_file(
            args.out, is_earlier_output=_is_plan_output, replace_earlier=args.force, name="--out"
        )
    result = plan.make_plan(plan.setup_from_config(cfg))
    if args.out is not None:
        atomic_write_json(args.out, result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_plan(result)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from hanlm import demo
    from hanlm.console import info
    from hanlm.files import STAGE_MARKER, fingerprint, write_stage_marker

    if args.size_mb <= 0:
        raise UserError(
            f"--size-mb must be positive, got {args.size_mb}",
            fix="give the size of the demo world's documents in MB, e.g. --size-mb 1",
        )
    check_folder_path(args.out, "--out")

    def holds_a_demo_world(_: Path) -> bool:
        try:
            return read_json(args.out / STAGE_MARKER).get("stage") == "demo"
        except (OSError, ValueError, AttributeError):
            return False

    # the world's files go next to whatever else the folder holds: only they are checked
    for name in (*demo.FILE_NAMES.values(), STAGE_MARKER):
        claim_output_file(
            args.out / name,
            is_earlier_output=holds_a_demo_world,
            replace_earlier=args.force,
            name="--out",
        )
    paths = demo.write(demo.build(seed=args.seed, size_mb=args.size_mb), args.out)
    # the same marker a run's demo/ folder has: a later --force knows the files are the demo's
    fp = fingerprint({"seed": args.seed, "size_mb": args.size_mb})
    write_stage_marker(args.out, "demo", fp)
    info("demo world written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        from rich.markup import escape

        from hanlm.console import console

        # escaped: a message may hold [brackets] (TOML tables, paths) that are not markup
        console.print(f"[bold red]error:[/bold red] {escape(e.message)}", soft_wrap=True)
        return 2
    except Exception as e:
        from hanlm.train.preemption import Preempted

        if not isinstance(e, Preempted):
            raise
        from hanlm.console import console

        console.print(f"[bold yellow]preempted:[/bold yellow] {e}", soft_wrap=True)
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
