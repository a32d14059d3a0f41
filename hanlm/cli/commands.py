"""The bodies of the `hanlm` commands: each loads its configuration and calls its stage or
library; hanlm.cli.parser names them as its subcommands' `func`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hanlm import exit_status, ranks, remote_code
from hanlm.cli import config_flags
from hanlm.data import fact_statements
from hanlm.errors import UserError
from hanlm.files import check_folder_path, claim_output_dir, claim_output_file
from hanlm.prompts import read_prompts, write_results

# The imports inside the functions below are deferred on purpose: a command imports only what it
# runs (torch and transformers ~1 s, pydantic's config models ~0.1 s, rich ~0.05 s), so that
# `hanlm --help` and a mistyped argument answer at once.

DEFAULT_RUN = "runs/demo"  # the run directory when --run is not given


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """{config key: value} of the config flags given."""
    values = config_flags.flag_values(args)
    if "pretrain.max_tokens" in values and "pretrain.max_steps" not in values:
        values["pretrain.max_steps"] = None  # --max-tokens replaces the recipe's max_steps
    return values


def _load(args: argparse.Namespace):
    from hanlm.stages.rundir import load_run_config

    cfg = load_run_config(args.run, args.config, args.overrides, flag_values(args))
    remote_code.allow(cfg.model.trust_remote_code)  # for this command (its remote_code.scope)
    return cfg


def _save(cfg, run: Path) -> None:
    """Every command that ran a stage on a run saves the configuration it used there."""
    from hanlm.stages.rundir import save_run_config

    save_run_config(cfg, run)


def cmd_stage(args: argparse.Namespace) -> int:
    from hanlm.pipeline import run_stage

    run_stage(args.stage, _load(args), args.run, force=args.force)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from hanlm.pipeline import run_stage
    from hanlm.stages.stage import Unfinished

    if args.stop_after_steps is not None and args.stop_after_steps < 1:
        raise UserError(
            f"--stop-after-steps must be at least 1, got {args.stop_after_steps}",
            fix="give the number of steps to train before stopping",
        )
    options = {"stop_after_steps": args.stop_after_steps} if args.stop_after_steps else {}
    result = run_stage("pretrain", _load(args), args.run, force=args.force, **options)
    return exit_status.STOPPED if isinstance(result, Unfinished) else exit_status.SUCCESS


def cmd_export(args: argparse.Namespace) -> int:
    from hanlm.stages import export

    cfg = _load(args)
    if args.format == "gguf":
        if args.checkpoint is not None:
            raise UserError(
                "--checkpoint chooses what the Hugging Face export reads; GGUF is written from "
                "an exported folder",
                fix="export the step first (hanlm export --checkpoint STEP --out DIR), then "
                "hanlm export --format gguf --source DIR",
            )
        export.run_gguf(
            cfg,
            args.run,
            gguf_type=args.gguf_type,
            source=args.source,
            out=args.out,
            force=args.force,
        )
        return 0
    if args.source is not None or args.gguf_type != "f16":
        raise UserError("--source and --gguf-type belong to --format gguf", fix="add --format gguf")
    if args.checkpoint is None and args.out is None:
        from hanlm.pipeline import run_stage

        run_stage("export", cfg, args.run, force=args.force)
        return 0
    export.export_chosen(cfg, args.run, checkpoint=args.checkpoint, out=args.out, force=args.force)
    _save(cfg, args.run)
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from hanlm.pipeline import run_stage

    run_stage("sft", _load(args), args.run, force=args.force)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from hanlm.chat import doctor

    remote_code.allow(args.trust_remote_code)  # no recipe: the flag is the setting
    report = doctor.diagnose(args.model_dir)
    doctor.print_report(report)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    return 0 if report["healthy"] else 1


def cmd_run(args: argparse.Namespace) -> int:
    from hanlm.console import warn
    from hanlm.pipeline import run_pipeline
    from hanlm.stages.stage import Unfinished

    results = run_pipeline(_load(args), args.run, from_stage=args.from_stage, until=args.until)
    # 0 only when every stage finished: a launcher or `hanlm run && hanlm publish` goes on from
    # it (a NO-GO preflight that preflight.fail_on_no_go = false lets through is not a stop)
    unfinished = [
        name for name, r in results.items() if isinstance(r, Unfinished) and name != "preflight"
    ]
    if unfinished:
        warn(f"run: {', '.join(unfinished)} stopped before the end; run the same command again")
        return exit_status.STOPPED
    return exit_status.SUCCESS


def cmd_rehearse(args: argparse.Namespace) -> int:
    from hanlm.rehearse import run as rehearse

    record = rehearse.rehearse(_load(args), args.run, tune=args.tune)
    return rehearse.exit_status_of(record)


def cmd_launch(args: argparse.Namespace) -> int:
    from hanlm.launch import command
    from hanlm.pipeline import STAGES

    cfg = _load(args)
    if args.status:
        result = command.status(cfg, args.run)
    else:
        record = command.launch(cfg, args.run, stages=list(STAGES), dry_run=args.dry_run)
        result = record.to_json()
        _save(cfg, args.run)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from hanlm.stages import preflight

    report = preflight.check(_load(args), args.run)
    if args.json and ranks.is_main():
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    return exit_status.SUCCESS if report.go else exit_status.HOST_REJECTED


def cmd_eval(args: argparse.Namespace) -> int:
    from hanlm.evals import run as eval_run
    from hanlm.stages import eval as eval_stage

    cfg = _load(args)
    if args.out is None:
        from hanlm.pipeline import run_stage

        run_stage("eval", cfg, args.run, force=args.force)
        return 0
    in_run = args.run.is_dir()  # a run's demo world and decontam report serve as defaults
    models = [
        eval_stage.model_folder(model) for model in cfg.eval.models
    ] or eval_stage.default_models(args.run)
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


def cmd_decontam(args: argparse.Namespace) -> int:
    from hanlm.data.decontam.scan import expand_corpus, parse_shard
    from hanlm.pipeline import run_stage
    from hanlm.stages import decontam
    from hanlm.stages.rundir import RunDir, load_run_config

    standalone = args.out is not None
    if standalone and args.corpus is None and not args.merge:
        raise UserError("--out needs --corpus GLOB", fix="or scan a run's corpus with --run DIR")
    if args.corpus is not None and not standalone:
        raise UserError("--corpus needs --out DIR", fix="pass --out DIR for the results")
    if standalone:  # the results go to OUT/decontam/: refuse what is in the way before scanning
        check_folder_path(args.out, "--out")
        claim_output_dir(RunDir(args.out).decontam, name="the results folder")
    run_dir = None if standalone else args.run
    cfg = load_run_config(run_dir, args.config, args.overrides, flag_values(args))
    shard = parse_shard(args.shard)
    options = {"shard": shard, "merge": args.merge}
    if standalone:
        # OUT/ holds decontam/ and decontam-partial/ as a run folder would
        options["standalone"] = True
    if standalone and not args.merge:
        # before anything is written: files that are not there, or a benchmark only a run has
        expand_corpus(args.corpus)
        decontam.benchmark_specs(cfg.decontam.benchmarks, None)
        options["corpus"] = args.corpus
    out = RunDir(args.out) if standalone else run_dir
    # a standalone scan's OUT is the user's folder, not a run's: no config.toml there
    run_stage("decontam", cfg, out, force=args.force, save_config=not standalone, **options)
    return 0


def _decoding_settings(args: argparse.Namespace):
    given = flag_values(args)
    sampling = ("generate.temperature", "generate.top_k", "generate.top_p")
    if given.get("generate.greedy") and any(key in given for key in sampling):
        raise UserError(
            "--greedy takes no --temperature, --top-k or --top-p",
            fix="drop --greedy to sample, or drop the sampling flags",
        )
    return _load(args).generate


def cmd_generate(args: argparse.Namespace) -> int:
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
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines]
    except (OSError, ValueError):
        return False
    return bool(rows) and all(
        isinstance(row, dict) and {"prompt", "text"} <= row.keys() for row in rows
    )


def _is_plan_output(path: Path) -> bool:
    """Whether `path` is a plan `hanlm plan --out` wrote: it reads as one."""
    from hanlm.plan.estimate import Plan

    return Plan.is_one(path)


def cmd_chat(args: argparse.Namespace) -> int:
    from hanlm.chat.session import run_repl
    from hanlm.inference import load

    settings = _decoding_settings(args)
    return run_repl(load(args.model_dir, settings.device), settings, system=args.system)


def cmd_serve(args: argparse.Namespace) -> int:
    from hanlm.serve import serve
    from hanlm.serve.target import run_of

    served_run = run_of(args.target)
    if served_run is not None and args.run == Path(DEFAULT_RUN) and args.config is None:
        args.run = served_run  # a run's model answers with the run's own [generate] settings
    _decoding_settings(args)  # --greedy with sampling flags is refused here as everywhere
    return serve(
        args.target,
        _load(args),
        engine=args.engine,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        gguf_type=args.gguf_type,
        threads=args.threads,
    )


def cmd_plan(args: argparse.Namespace) -> int:
    from hanlm.plan.recipe import plan_recipe
    from hanlm.plan.table import print_plan
    from hanlm.stages import plan as plan_stage
    from hanlm.stages.rundir import RunDir, load_run_config

    values = flag_values(args)
    cfg = load_run_config(args.run, args.config, args.overrides, values, recipe_fallback=False)
    if args.out is not None:
        claim_output_file(
            args.out, is_earlier_output=_is_plan_output, replace_earlier=args.force, name="--out"
        )
    rehearsal = plan_stage.rehearsal(RunDir.of(args.run)) if args.run is not None else None
    result = plan_recipe(cfg, rehearsal=rehearsal)
    if args.out is not None:
        result.write(args.out)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_plan(result)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from hanlm.console import info
    from hanlm.demo.folder import write_folder

    if args.size_mb <= 0:
        raise UserError(
            f"--size-mb must be positive, got {args.size_mb}",
            fix="give the size of the demo world's documents in MB, e.g. --size-mb 1",
        )
    paths = write_folder(args.out, args.seed, args.size_mb, force=args.force)
    info("demo world written: " + ", ".join(str(path) for path in paths.values()))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from hanlm.cli import publish
    from hanlm.stages.rundir import load_run_config

    cfg = load_run_config(args.run, None, None, flag_values(args), recipe_fallback=False)
    summary = publish.run(
        cfg,
        args.run,
        repo=args.repo,
        model=args.model,
        out=args.out,
        dry_run=args.dry_run,
        gguf=args.gguf,
        force=args.force,
    )
    print(summary.get("url") or summary["folder"])
    return 0


def cmd_facts(args: argparse.Namespace) -> int:
    from hanlm.console import info

    done = fact_statements.write(
        args.table,
        args.out,
        templates_file=args.templates,
        reverse_share=args.reverse_share,
        copies=args.copies,
        seed=args.seed,
        probe_out=args.probe_table,
        replace=args.force,
    )
    info(
        f"facts: {done['documents']:,} documents from {done['facts']:,} facts "
        f"({done['reverse_stated']:,} also stated object first) -> {args.out}"
    )
    return 0
