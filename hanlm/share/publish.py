"""`hanlm publish`: a run's exported model, with a model card built from the run, written to a
folder and uploaded to a Hugging Face Hub model repository.

The folder (default RUN/publish/) holds exactly what goes to the Hub: the export's files
(hard-linked where the file system allows: a real model is gigabytes), README.md (the card,
hanlm.share.model_card), the report card's figures under plots/, and the GGUF file when one is
given. `--dry-run` stops there, without network. An upload first checks the login (a token from
HF_TOKEN or `hf auth login`, accepted by the Hub) before it writes or sends anything, so a
missing token or no network is one UserError saying how to log in.

The command (hanlm.cli.publish) says where each of the run's files is (`RunFiles`).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info
from hanlm.data.decontam.outputs import DecontamReport
from hanlm.errors import UserError
from hanlm.evals.results import EvalResults, TaskRecord, TaskScores
from hanlm.files import atomic_output_dir, atomic_write_json, fingerprint, read_json
from hanlm.model_folder import check_model_folder, is_model_folder
from hanlm.plan.estimate import Plan
from hanlm.preflight.report import PreflightReport
from hanlm.share import model_card
from hanlm.train.results import PretrainSummary, SftSummary, read_metrics

STAGE = "publish"
CARD = "README.md"
# The folder's completion marker, its own name so that a stage's folder (stage.json) is never
# taken for an earlier publish folder and replaced; it stays home when the folder is uploaded.
MARKER = "hanlm_publish.json"
PLOTS = "plots"
KINDS = ("chat", "base")
GGUF_MAGIC = b"GGUF"
LOGIN_FIX = (
    "log in with `hf auth login` (or set HF_TOKEN to a token with write access from "
    "https://huggingface.co/settings/tokens), or write the folder without uploading: --dry-run"
)


@dataclass(frozen=True)
class RunFiles:
    """Every file publishing reads; a missing optional one is a stage that has not run."""

    name: str  # the run's name: the repository name of a dry run given no --repo
    exports: dict[str, Path]  # "chat" / "base" -> the Hugging Face folder of that model
    eval_results: Path
    decontam_report: Path
    plan: Path
    preflight: Path
    pretrain_summary: Path
    pretrain_metrics: Path
    sft_summary: Path
    report: Path
    plots: Path
    fixes: dict[str, str]  # what to run for a missing "export" / "chat" / "eval"


# --- what to publish -----------------------------------------------------------------------------


def choose_export(files: RunFiles, model: str | None) -> tuple[str, Path]:
    """(kind, folder): the chat export when the run has one and `model` is not "base"."""
    if model is not None and model not in KINDS:
        raise UserError(f"--model must be chat or base, not {model!r}")
    if model is None:
        model = "chat" if is_model_folder(files.exports["chat"]) else "base"
    folder = files.exports[model]
    if not is_model_folder(folder):
        other = "base" if model == "chat" else "chat"
        also = (
            f", or publish the {other} model (--model {other})"
            if is_model_folder(files.exports[other])
            else ""
        )
        raise UserError(
            f"the run has no exported {model} model (no {folder}/config.json)",
            fix=files.fixes["chat" if model == "chat" else "export"] + also,
        )
    return model, check_model_folder(folder)


def _model_scores(
    results: EvalResults, folder: Path, where: Path, fix: str
) -> dict[str, TaskScores]:
    """The scores of `folder`'s model in results.json: the entry whose model_dirs path is that
    folder, or (a run moved since) ends in the same <stage>/hf."""
    dirs = results.model_dirs
    scores = results.results
    target = folder.resolve()
    tail = folder.parts[-2:]
    for match in (
        lambda p: Path(p).resolve() == target,
        lambda p: Path(p).parts[-2:] == tail,
    ):
        for name, path in dirs.items():
            if match(path) and name in scores:
                return scores[name]
    raise UserError(
        f"the evaluation results hold no scores of {folder}",
        where=str(where),
        fix=fix,
    )


def count_parameters(folder: Path) -> int:
    """The number of values in the folder's safetensors weights (headers only: milliseconds)."""
    from safetensors import safe_open  # deferred: a heavy import `hanlm --help` spares

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                total += math.prod(f.get_slice(name).get_shape())
    return total


def hub_sources(tasks: dict[str, TaskRecord]) -> dict[str, tuple[str, str | None, None]]:
    """task -> the Hub dataset (NAME, CONFIG, None) a task read from a local copy is a copy of,
    as the task itself names it (KoBEST: skt/kobest_v1); the split stays unclaimed: a local
    file may hold any of them. Tasks not known here (or without one) are left out."""
    # deferred: the task registry imports every task module, which only publishing needs here
    from hanlm.evals import tasks as tasks_lib

    found = {}
    for name, record in tasks.items():
        if model_card.hf_dataset(record.source) is not None:
            continue
        try:
            default = tasks_lib.get(name).default_source(None)
        except UserError:  # a task of a newer hanlm, or a custom one: named by its own name
            continue
        dataset = model_card.hf_dataset(default)
        if dataset is not None:
            found[name] = (dataset[0], dataset[1], None)
    return found


def _hf_datasets(sources: list[str]) -> list[str]:
    found = []
    for source in sources:
        dataset = model_card.hf_dataset(source)
        if dataset is not None and dataset[0] not in found:
            found.append(dataset[0])
    return found


def read_facts(
    files: RunFiles,
    kind: str,
    folder: Path,
    *,
    repo_id: str,
    license: str,
    recipe: Config | None,
    gguf_name: str | None,
) -> model_card.CardFacts:
    """Read what the card needs; no eval results (or none of this model) is a UserError."""
    if not files.eval_results.exists():
        raise UserError(
            f"the run has no evaluation results: {files.eval_results} does not exist",
            fix=files.fixes["eval"],
        )
    results = EvalResults.read(files.eval_results, fix=files.fixes["eval"])
    scores = _model_scores(results, folder, files.eval_results, files.fixes["eval"])
    corpus_inputs = list(dict.fromkeys(recipe.corpus.all_inputs())) if recipe else []
    chat = [i for s in recipe.sft.source_list() for i in s.inputs] if recipe else []
    trained_on = corpus_inputs + (chat if kind == "chat" else [])
    plots = sorted(p.name for p in files.plots.glob("*.png")) if files.plots.is_dir() else []
    report = files.report.read_text(encoding="utf-8") if files.report.is_file() else None
    return model_card.CardFacts(
        repo_id=repo_id,
        kind=kind,
        license=license,
        model_config=read_json(folder / "config.json"),
        parameters=count_parameters(folder),
        scores=scores,
        tasks=results.tasks,
        hub_sources=hub_sources(results.tasks),
        split_note=results.contamination_splits,
        datasets=_hf_datasets(trained_on),
        corpus_inputs=corpus_inputs,
        recipe=recipe,
        decontam=DecontamReport.read_if_present(files.decontam_report),
        plan=Plan.read_if_present(files.plan),
        preflight=PreflightReport.read_if_present(files.preflight),
        pretrain_summary=PretrainSummary.read_if_present(files.pretrain_summary),
        pretrain_metrics=read_metrics(files.pretrain_metrics),
        sft_summary=SftSummary.read_if_present(files.sft_summary) if kind == "chat" else None,
        report=report,
        plots=[f"{PLOTS}/{p}" for p in plots],
        gguf=gguf_name,
    )


def check_gguf(path: Path | None) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"--gguf {path} is not a file",
            fix="give the file `hanlm export --format gguf` wrote, or leave --gguf out",
        )
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC or path.suffix != ".gguf":
        raise UserError(
            f"--gguf {path} is not a GGUF file (a .gguf file starting with {GGUF_MAGIC.decode()})",
            fix="give the file `hanlm export --format gguf` wrote",
        )
    return path


def check_repo_id(repo: str) -> str:
    # deferred: huggingface_hub costs ~0.3 s, paid only by `hanlm publish`
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise UserError(
            f"--repo {repo!r} is not a Hub repository name: {e}",
            fix="write NAME or OWNER/NAME: letters, digits, '-', '_', '.', at most 96 "
            "characters, e.g. --repo my-org/ko-small-chat",
        ) from None
    return repo


# --- the folder --------------------------------------------------------------------------------


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link (no second copy of gigabytes of weights), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_folder(
    out: Path,
    export: Path,
    facts: model_card.CardFacts,
    *,
    plots: Path,
    gguf: Path | None,
    replace_earlier: bool,
) -> dict:
    """Write the repository's contents to `out` atomically; returns what it holds."""
    card = model_card.render(facts)
    names = [p.name for p in export.iterdir() if p.is_file() and p.name != CARD]
    with atomic_output_dir(out, marker=MARKER, replace_earlier=replace_earlier) as tmp:
        for name in names:
            _link_or_copy(export / name, tmp / name)
        if facts.plots:
            (tmp / PLOTS).mkdir()
            for repo_path in facts.plots:
                _link_or_copy(plots / Path(repo_path).name, tmp / repo_path)
        if gguf is not None:
            _link_or_copy(gguf, tmp / gguf.name)
        (tmp / CARD).write_text(card, encoding="utf-8")
        marker = {
            "stage": STAGE,
            "fingerprint": fingerprint(card, names, gguf and gguf.name),
            "repo": facts.repo_id,
            "kind": facts.kind,
            "source": str(export),
        }
        atomic_write_json(tmp / MARKER, marker)
    return {"folder": str(out), "files": sorted([*names, CARD]), "plots": facts.plots}


# --- the Hub -----------------------------------------------------------------------------------


def network_errors() -> tuple[type[BaseException], ...]:
    """What a request to the Hub raises when the network or the Hub says no: huggingface_hub's
    HTTP and offline errors are OSErrors; its HTTP client's transport errors are not."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):  # a client it does not use
            errors.append(importlib.import_module(module).HTTPError)
    return tuple(errors)


def login():
    """(HfApi, user name), once the Hub has accepted the token; else a UserError saying how to
    log in. Nothing is written or sent before this passes."""
    # deferred: huggingface_hub, paid only by `hanlm publish`
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    token = get_token()
    if not token:
        raise UserError("not logged in to the Hugging Face Hub (no token)", fix=LOGIN_FIX)
    api = HfApi(token=token)
    try:
        user = api.whoami()
    except OfflineModeIsEnabled:
        raise UserError(
            "cannot reach the Hugging Face Hub: HF_HUB_OFFLINE is set",
            fix="unset HF_HUB_OFFLINE to upload, or write the folder only with --dry-run",
        ) from None
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", None)
        if status == 401:
            raise UserError(
                "the Hugging Face Hub refused the token (invalid or expired)", fix=LOGIN_FIX
            ) from None
        raise UserError(f"the Hugging Face Hub answered: {e}", fix=LOGIN_FIX) from None
    except network_errors() as e:
        raise UserError(
            f"cannot reach the Hugging Face Hub ({type(e).__name__}: {e})",
            fix="check the network (or HF_ENDPOINT), then " + LOGIN_FIX,
        ) from None
    return api, user.get("name") if isinstance(user, dict) else None


def upload(api, repo_id: str, folder: Path, *, private: bool) -> str:
    """Create the model repository (kept as it is if it exists) and upload `folder` in one
    commit, without hanlm's completion marker. Returns the repository's URL."""
    from huggingface_hub.errors import HfHubHTTPError  # deferred: as in login()

    try:
        repo = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            repo_type="model",
            folder_path=str(folder),
            commit_message="hanlm publish: model, card from the run, report figures",
            ignore_patterns=[MARKER],
        )
    except HfHubHTTPError as e:
        raise UserError(
            f"the Hugging Face Hub refused the upload to {repo_id}: {e}",
            fix="check that the token may write to that namespace (a write token; an "
            "organisation you belong to), then run again: the folder is kept",
            where=str(folder),
        ) from None
    except network_errors() as e:
        raise UserError(
            f"the upload to {repo_id} failed ({type(e).__name__}: {e})",
            fix="check the network and run again: the folder is kept, the Hub skips files "
            "already uploaded",
            where=str(folder),
        ) from None
    return str(getattr(repo, "url", None) or f"https://huggingface.co/{repo_id}")


def publish(
    files: RunFiles,
    *,
    out: Path,
    repo: str | None,
    model: str | None = None,
    dry_run: bool = False,
    private: bool = False,
    license: str = "apache-2.0",
    recipe: Config | None = None,
    gguf: Path | None = None,
    replace_earlier: bool = True,
) -> dict:
    """Write the repository folder and, unless `dry_run`, upload it (see the module docstring).
    Every input is checked, and the login too, before anything is written."""
    if repo is None and not dry_run:
        raise UserError("publish needs --repo NAME (or OWNER/NAME)", fix="or pass --dry-run")
    repo_id = check_repo_id(repo if repo is not None else files.name)
    kind, folder = choose_export(files, model)
    gguf = check_gguf(gguf)
    facts = read_facts(
        files,
        kind,
        folder,
        repo_id=repo_id,
        license=license,
        recipe=recipe,
        gguf_name=gguf.name if gguf else None,
    )
    api = None
    if not dry_run:
        api, user = login()
        if "/" not in repo_id and user:
            repo_id = f"{user}/{repo_id}"  # the card's snippets name the full repository
            facts = replace(facts, repo_id=repo_id)
    written = write_folder(
        out, folder, facts, plots=files.plots, gguf=gguf, replace_earlier=replace_earlier
    )
    summary = {"repo": repo_id, "model": kind, "source": str(folder), **written}
    info(f"publish: {kind} model from {folder} with its card written to {out}")
    if dry_run:
        info(f"publish: dry run, nothing uploaded; check {out / CARD}")
        return summary
    summary["url"] = upload(api, repo_id, out, private=private)
    info(f"publish: uploaded to {summary['url']}")
    return summary
