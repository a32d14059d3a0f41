"""`hf:` ids: which files hold a dataset's CONFIG and SPLIT, in a local snapshot of its Hub
repository or on the Hub itself, and the commit they are read at.

One spelling everywhere (corpus, decontam, eval, SFT data): `hf:NAME[@REVISION]:SPLIT` or
`hf:NAME[@REVISION]:CONFIG:SPLIT`. NAME is a local folder when one exists at that path (what
`hf download REPO --repo-type dataset --local-dir DIR` leaves), else a Hub id. The files of a
split are found as `datasets` finds them: the `configs` in the repository's README.md (its YAML
header), else the files whose path names the split. On the Hub they are listed through
huggingface_hub's fsspec filesystem at one resolved commit, so a dataset updated upstream is new
input, and a parquet file's row groups can be read one task at a time without downloading it.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from hanlm.errors import UserError
from hanlm.streams import open_text_stream, strip_compression_suffix

# Where a dataset's files lie in its Hub repository, for the download command of the error
# messages: {config} and {split} are filled in. Other datasets get the whole repository.
HF_LAYOUTS = {
    "HuggingFaceFW/fineweb-2": "data/{config}/{split}",  # data/kor_Hang/train/000_00000.parquet
    "wikimedia/wikipedia": "{config}",  # 20231101.ko/train-00000-of-00003.parquet
}
DATA_SUFFIXES = (".parquet", ".jsonl", ".txt")
HUB_FILE = "hf://"  # a file of a Hub dataset repository, at a commit: hf://datasets/REPO@SHA/PATH
SPELLING = "hf:NAME[@REVISION]:SPLIT or hf:NAME[@REVISION]:CONFIG:SPLIT"
_TRUE = ("1", "ON", "YES", "TRUE")


def is_hf_id(spec) -> bool:
    """An `hf:` dataset id (not one of its files, `hf://...`)."""
    return isinstance(spec, str) and spec.startswith("hf:") and not spec.startswith(HUB_FILE)


def is_hub_file(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(HUB_FILE)


def parse_hf(spec: str) -> tuple[str, str | None, str]:
    """(name, config, split) of `hf:NAME[@REVISION][:CONFIG]:SPLIT`; the name keeps its
    `@REVISION` (hub_name_and_revision splits it). Two parts are always NAME and SPLIT."""
    parts = spec[len("hf:") :].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise UserError(
            f"bad Hugging Face dataset id {spec!r}",
            fix=f"write it as {SPELLING} (NAME a Hub id or a local snapshot folder of a dataset "
            "repository; two parts are always NAME and SPLIT)",
        )
    return (parts[0], None, parts[1]) if len(parts) == 2 else (parts[0], parts[1], parts[2])


def hub_name_and_revision(name: str) -> tuple[str, str | None]:
    """`org/name@REVISION` -> ("org/name", "REVISION"); no @: (name, None)."""
    repo, sep, revision = name.partition("@")
    return (repo, revision) if sep and revision else (name, None)


def hf_offline() -> bool:
    return any(
        os.environ.get(var, "").upper() in _TRUE
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


# --- a local snapshot ------------------------------------------------------------------------


def snapshot_folder(spec: str) -> Path | None:
    """The local folder `hf:NAME...` names when NAME is one (a snapshot of a dataset
    repository, as `hf download REPO --repo-type dataset --local-dir DIR` leaves it), else None."""
    name = parse_hf(spec)[0]
    folder = Path(os.path.expanduser(name))
    return folder if folder.is_dir() else None


def snapshot_files(spec: str) -> list[Path]:
    """The data files of CONFIG's SPLIT in a local snapshot (see the module's docstring)."""
    folder = snapshot_folder(spec)
    assert folder is not None
    _, config, split = parse_hf(spec)
    readme = folder / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else None
    patterns = split_patterns(text, str(readme), spec, config, split)
    files: list[Path] = []
    for pattern in patterns:
        for match in sorted(glob.glob(str(folder / pattern), recursive=True)):
            path = Path(match)
            cached = ".cache" in path.relative_to(folder).parts
            if path.is_file() and not cached and _is_data_file(path.name) and path not in files:
                files.append(path)
    if not files:
        raise _no_files(spec, f"the snapshot folder {folder}", config, split, patterns)
    return files


def snapshot_revision(folder: Path) -> str | None:
    """The commit a snapshot was downloaded at, as `hf download --local-dir` records it in
    .cache/huggingface/download/*.metadata (first line of each); None when it did not (the
    files' sizes and times then stand for the content)."""
    commits = set()
    for metadata in (folder / ".cache" / "huggingface" / "download").rglob("*.metadata"):
        first = metadata.read_text(errors="replace").split("\n", 1)[0].strip()
        if len(first) == 40 and all(c in "0123456789abcdef" for c in first):
            commits.add(first)
    return commits.pop() if len(commits) == 1 else None


# --- the Hub ---------------------------------------------------------------------------------


def hub_filesystem():
    """huggingface_hub's fsspec filesystem (`hf://`): the Hub's files by path, read by range."""
    from huggingface_hub import HfFileSystem  # deferred: the network, for Hub inputs only

    return HfFileSystem()


def hub_commit(repo: str, revision: str | None = None) -> str | None:
    """The commit `revision` (default: the main branch) of dataset `repo` resolves to; None
    offline or when the Hub cannot be reached or does not know it."""
    if hf_offline():
        return None
    from huggingface_hub import HfApi  # deferred: the network, for Hub inputs only

    try:
        return HfApi().dataset_info(repo, revision=revision, timeout=30).sha
    except Exception:  # unreachable or unknown: reading it will say why, with the fix
        return None


def hub_split_files(spec: str) -> list[str]:
    """`hf://datasets/REPO@COMMIT/PATH` of each data file of CONFIG's SPLIT of a Hub dataset,
    listed at the commit its revision resolves to now (online only)."""
    name, config, split = parse_hf(spec)
    repo, revision = hub_name_and_revision(name)
    commit = hub_commit(repo, revision)
    if commit is None:
        raise UserError(
            f"{spec} cannot be listed: the Hub is "
            + ("set offline" if hf_offline() else "unreachable or does not know it"),
            fix=hf_download_fix(spec),
        )
    fs = hub_filesystem()
    root = f"datasets/{repo}@{commit}"
    readme = f"{root}/README.md"
    text = fs.cat_file(readme).decode("utf-8", "replace") if fs.exists(readme) else None
    patterns = split_patterns(text, f"{repo}/README.md", spec, config, split)
    files: list[str] = []
    for pattern in patterns:
        for match in sorted(fs.glob(f"{root}/{pattern}")):
            if _is_data_file(match) and match not in files and fs.isfile(match):
                files.append(match)
    if not files:
        raise _no_files(
            spec, f"the Hub repository {repo} at {commit[:12]}", config, split, patterns
        )
    return [HUB_FILE + f for f in files]


def open_hub_file(url: str):
    """An `hf://` file opened for reading by range (pyarrow reads a parquet footer and the row
    groups asked for, not the file)."""
    return hub_filesystem().open(url[len(HUB_FILE) :], "rb")


def file_name(source: str | Path) -> str:
    return PurePosixPath(str(source)).name


# --- both ------------------------------------------------------------------------------------


def input_revisions(inputs: list[str]) -> dict[str, str | None]:
    """The commit each `hf:` input is read at: a local snapshot's download commit; a Hub id's
    pinned @REVISION, else (online) the commit the Hub resolves its default branch to, so that
    a dataset updated upstream is seen as new input; offline, None (it cannot be read then)."""
    out: dict[str, str | None] = {}
    for spec in inputs:
        if not is_hf_id(spec):
            continue
        folder = snapshot_folder(spec)
        if folder is not None:
            out[spec] = snapshot_revision(folder)
            continue
        repo, revision = hub_name_and_revision(parse_hf(spec)[0])
        out[spec] = revision or hub_commit(repo)
    return out


def split_patterns(
    readme: str | None, where: str, spec: str, config: str | None, split: str
) -> list[str]:
    """The data_files patterns of CONFIG's SPLIT: from the README's `configs` when it has them,
    else datasets' own layout rules (files under a folder named for the split, or named
    SPLIT-*, SPLIT_*, SPLIT.*; under CONFIG/ when a config is named)."""
    patterns = _readme_patterns(readme, where, spec, config, split) if readme else None
    if patterns is not None:
        return patterns
    patterns = [f"**/{split}/**/*", f"**/{split}-*", f"**/{split}_*", f"**/{split}.*"]
    if config is not None:
        patterns = [f"**/{config}/{p.removeprefix('**/')}" for p in patterns]
    return patterns


def _readme_patterns(
    readme: str, where: str, spec: str, config: str | None, split: str
) -> list[str] | None:
    from huggingface_hub import RepoCard  # deferred: only hf: inputs need it

    try:
        configs = RepoCard(readme).data.to_dict().get("configs")
    except Exception as e:  # a README whose YAML header does not parse
        raise UserError(
            f"{spec}: the YAML header of {where} does not parse ({type(e).__name__}: {e})",
            where=where,
            fix="repair the README's header, or name the files with a glob instead",
        ) from None
    if not isinstance(configs, list) or not configs:
        return None
    named = {c.get("config_name", "default"): c for c in configs if isinstance(c, dict)}
    name = parse_hf(spec)[0]
    if config is None:
        defaults = [c for c in named.values() if c.get("default")]
        chosen = (
            defaults[0] if defaults else (next(iter(named.values())) if len(named) == 1 else None)
        )
        if chosen is None:
            raise UserError(
                f"{spec}: the dataset has several configs and none is the default: "
                f"{', '.join(named)}",
                fix=f"name one: hf:{name}:CONFIG:{split}",
            )
    elif config in named:
        chosen = named[config]
    else:
        raise UserError(
            f"{spec}: the dataset has no config {config!r}; its configs are {', '.join(named)}",
            where=where,
            fix=f"use one of them: hf:{name}:CONFIG:{split}",
        )
    data_files = chosen.get("data_files", [])
    if isinstance(data_files, (str, list)) and not (
        isinstance(data_files, list) and data_files and isinstance(data_files[0], dict)
    ):
        by_split = {"train": data_files}  # files without splits are the train split
    else:
        by_split = {d.get("split", "train"): d.get("path", []) for d in data_files}
    if split not in by_split:
        raise UserError(
            f"{spec}: config {chosen.get('config_name', 'default')!r} has no split {split!r}; "
            f"its splits are {', '.join(by_split)}",
            where=where,
            fix="name one of them",
        )
    paths = by_split[split]
    return [paths] if isinstance(paths, str) else list(paths)


def _is_data_file(name: str) -> bool:
    return PurePosixPath(strip_compression_suffix(file_name(name))).suffix.lower() in DATA_SUFFIXES


def _no_files(spec: str, place: str, config, split, patterns) -> UserError:
    return UserError(
        f"{spec}: {place} has no data files for "
        f"{'config ' + repr(config) + ', ' if config else ''}split {split!r} "
        f"(looked for {', '.join(patterns)})",
        fix="check the split and config names against the dataset's README.md `configs`, "
        "or download the files of that split",
    )


def hf_download_fix(spec: str) -> str:
    """How to read `spec` without the network: download its files once into a folder, then
    name the folder in the same spelling (hf:DIR[:CONFIG]:SPLIT reads a local snapshot)."""
    name, config, split = parse_hf(spec)
    name, revision = hub_name_and_revision(name)
    pinned = f" --revision {revision}" if revision else ""
    local = f"hf:DIR:{config}:{split}" if config else f"hf:DIR:{split}"
    layout = HF_LAYOUTS.get(name)
    include = ""
    if layout is not None and ("{config}" not in layout or config):
        include = f' --include "{layout.format(config=config, split=split)}/*" --include README.md'
    return (
        f"download it first: `hf download {name} --repo-type dataset{pinned}{include} "
        "--local-dir DIR` "
        "(huggingface_hub's command; `huggingface-cli download` with the same arguments on "
        f"huggingface_hub < 1.0), then name the folder instead: {local} (its README's configs "
        "say which files are that split, and the download's commit is recorded)"
    )


# --- a split's rows, for what reads a dataset whole (benchmarks, chat data) -------------------


@functools.cache
def local_copy(spec: str) -> Path:
    """A JSONL file of the rows of `spec`'s split, made once a process: a local snapshot's
    files read here (no network, no `datasets`); a Hub dataset loaded by `datasets` (from its
    cache when it was loaded before, so offline works then)."""
    parse_hf(spec)  # a malformed id: its UserError with the spelling
    out = Path(tempfile.mkdtemp(prefix="hanlm-hf-")) / "rows.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for row in split_rows(spec):
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return out


def split_rows(spec: str) -> Iterator[dict]:
    """The rows of `spec`'s split, in order (see local_copy)."""
    if snapshot_folder(spec) is not None:
        for path in snapshot_files(spec):
            yield from _file_rows(path)
        return
    name, config, split = parse_hf(spec)
    repo, revision = hub_name_and_revision(name)
    try:
        import datasets  # deferred: optional (hanlm[hf]) and heavy
    except ImportError:
        raise UserError(
            f"reading {spec} from the Hub needs the `datasets` package",
            fix=f"pip install 'hanlm[hf]', or {hf_download_fix(spec)}",
        ) from None
    pinned = {"revision": revision} if revision else {}
    try:
        rows = datasets.load_dataset(repo, config, split=split, **pinned)
    except Exception as e:  # offline, an unknown name, config or split: all the user's to fix
        raise UserError(
            f"cannot load {spec}: {type(e).__name__}: {e}",
            fix=f"check the id (written {SPELLING}: two parts are always NAME and SPLIT) on "
            f"huggingface.co and the network; or {hf_download_fix(spec)}",
        ) from None
    yield from rows


def _file_rows(path: Path) -> Iterator[dict]:
    kind = Path(strip_compression_suffix(path.name)).suffix.lower()
    if kind == ".parquet":
        import pyarrow.parquet as pq  # deferred: heavy

        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            yield from batch.to_pylist()
        return
    with open_text_stream(path) as stream:
        for number, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            if kind == ".txt":
                yield {"text": raw.decode("utf-8", "replace").rstrip("\n")}
                continue
            try:
                yield json.loads(raw)
            except ValueError as e:
                raise UserError(f"not a JSON line ({e})", where=f"{path}:{number}") from None
