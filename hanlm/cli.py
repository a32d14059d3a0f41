"""The `hanlm` command: parse, load the configuration, call the stage. Nothing else."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hanlm import __version__
from hanlm.errors import UserError

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
            "preset": "pretrain.preset",
            "max_steps": "pretrain.max_steps",
            "max_tokens": "pretrain.max_tokens",
            "precision": "pretrain.precision",
            "parallel": "pretrain.parallel",
            "resume": "pretrain.resume",
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
        "demo",
        help="write the built-in synthetic Korean world to a folder",
        description="Write the demo world (pretraining documents, yes/no benchmark "
        "with its planted subset, chat conversations, facts table) to --out.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size-mb", type=float, default=4.0)
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
    from hanlm.train import export

    cfg = _load(args)
    export.run(cfg, args.run, force=args.force, checkpoint=args.checkpoint, out=args.out)
    save_config(cfg, args.run)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from hanlm.pipeline import run_pipeline

    run_pipeline(_load(args), args.run, from_stage=args.from_stage, until=args.until)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from hanlm.console import info
    from hanlm.data import demo

    if args.size_mb <= 0:
        raise UserError(f"--size-mb must be positive, got {args.size_mb}")
    paths = demo.write(demo.build(seed=args.seed, size_mb=args.size_mb), args.out)
    info("demo world written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        from hanlm.console import console

        console.print(f"[bold red]error:[/bold red] {e.message}", soft_wrap=True)
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
