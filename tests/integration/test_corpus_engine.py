"""The corpus stage on the data engine: tasks from the input, workers that do not change the
output, resuming after a crash or a kill, errors from worker processes, Slurm submission."""

import itertools
import json
import math
import os
import random
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import assert_user_error, korquad_contexts, run_subprocess, write_jsonl
from hanlm.config import SourceFields, load_config
from hanlm.data import cleaning, dataset_repo, engine, readers
from hanlm.data.corpus import CorpusStats, iter_corpus
from hanlm.data.dedup import lsh_bands
from hanlm.errors import UserError
from hanlm.pipeline import run_stage


def corpus_files(tmp_path, shared, files=3, docs_per_file=150, seed=0):
    """Documents made of sentences from different KorQuAD paragraphs, with exact copies and
    near-copies (one sentence changed, spacing changed) planted across files."""
    sentences = [s for c in korquad_contexts(shared) for s in c.split(". ") if len(s) > 25]
    rng = random.Random(seed)
    docs = []
    for n in range(files * docs_per_file):
        roll = rng.random()
        if docs and roll < 0.05:
            text = rng.choice(docs)["text"]
        elif docs and roll < 0.075:
            text = rng.choice(docs)["text"].replace(" ", "", 3)  # spacing changed
        elif docs and roll < 0.10:
            parts = rng.choice(docs)["text"].split(". ")
            parts[rng.randrange(len(parts))] = rng.choice(sentences)  # one sentence changed
            text = ". ".join(parts)
        else:
            text = ". ".join(rng.sample(sentences, 10)) + "."
        docs.append({"id": f"d{n}", "text": text})
    paths = []
    for f in range(files):
        rows = docs[f * docs_per_file : (f + 1) * docs_per_file]
        paths.append(write_jsonl(tmp_path / "in" / f"part{f}.jsonl", rows))
    return paths


def config(tmp_path, workers=1, task_mb=1, **values):
    return load_config(
        values={
            "corpus.inputs": [str(tmp_path / "in" / "*.jsonl")],
            "corpus.near_dedup": True,
            "corpus.part_chars": 100_000,
            "data_engine.workers": workers,
            "data_engine.task_mb": task_mb,
            **values,
        }
    )


def output(run_dir):
    return [(d["id"], d["text"]) for d in iter_corpus(run_dir / "corpus")]


def counts(run_dir):
    stats = CorpusStats.read(run_dir / "corpus" / CorpusStats.FILE)
    return stats.model_dump(exclude={"seconds", "job_seconds", "inputs"})


# --- units ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_bytes", [1, 7, 50, 333, 10_000])
def test_byte_ranges_read_every_line_exactly_once(tmp_path, task_bytes):
    rng = random.Random(task_bytes)
    rows = [{"id": i, "text": "가" * rng.randint(0, 40) + f" {i}"} for i in range(120)]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    c = load_config().corpus
    whole = [d.text for d in readers.Unit(str(path)).documents(c, readers.Skips(strict=True))]
    units = readers.split_into_units([path], c, task_bytes)
    assert len(units) == (1 if task_bytes >= path.stat().st_size else len(units)) >= 1
    pieces = [d.text for u in units for d in u.documents(c, readers.Skips(strict=True))]
    assert pieces == whole == [r["text"] for r in rows]
    assert sum(u.nbytes for u in units) == path.stat().st_size


def test_compressed_and_block_text_files_are_not_cut(tmp_path):
    import gzip

    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"text": "x"}\n' * 1000))
    blocks = tmp_path / "b.txt"
    blocks.write_text("첫 문단\n\n둘째 문단\n" * 1000, encoding="utf-8")
    units = readers.split_into_units([gz, blocks], load_config().corpus, 100)
    assert [u.span for u in units] == [None, None]


@pytest.mark.parametrize("task_bytes", [1, 30_000, 60_000, 10**9])
def test_parquet_files_are_cut_by_row_groups_that_know_their_size(tmp_path, task_bytes):
    """Tasks of consecutive row groups of about task_bytes of text, sized from the footer
    alone (the text column's uncompressed bytes); each row read once, ids as in the whole file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(task_bytes)
    texts = ["가나다라" * rng.randint(1, 60) + f" {i}" for i in range(300)]
    path = tmp_path / "a.parquet"
    table = pa.table({"id": [f"r{i}" for i in range(300)], "text": texts})
    pq.write_table(table, path, row_group_size=40, compression="zstd")  # 8 row groups
    c = load_config().corpus
    whole = list(readers.Unit(str(path)).documents(c, readers.Skips(strict=True)))
    units = readers.split_into_units([path], c, task_bytes)
    groups = readers.parquet_row_groups(path, SourceFields())
    assert len(groups) == 8
    assert units[0].span[0] == 0 and units[-1].span[1] == 8
    assert all(a.span[1] == b.span[0] for a, b in itertools.pairwise(units))  # consecutive
    assert sum(u.nbytes for u in units) == sum(n for _, n in groups) > 0
    if task_bytes == 1:
        assert len(units) == 8  # a row group larger than the task is a task of its own
    elif task_bytes == 10**9:
        assert len(units) == 1
    else:
        assert 1 < len(units) < 8 and all(u.nbytes <= task_bytes or
                                          u.span[1] - u.span[0] == 1 for u in units)  # fmt: skip
    pieces = [d for u in units for d in u.documents(c, readers.Skips(strict=True))]
    assert [(d.id, d.text) for d in pieces] == [(d.id, d.text) for d in whole]
    assert [d.text for d in whole] == texts


def snapshot(root, commit="0123456789abcdef0123456789abcdef01234567"):
    """A FineWeb-2-shaped dataset repository as `hf download --local-dir` leaves it: configs in
    the README's YAML header, parquet files by config and split, the commit in .cache/."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "README.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: kor_Hang\n  data_files:\n"
        "  - split: train\n    path: data/kor_Hang/train/*\n"
        "  - split: test\n    path: data/kor_Hang/test/*\n"
        "- config_name: jpn_Jpan\n  data_files:\n"
        "  - split: train\n    path: data/jpn_Jpan/train/*\n"
        "---\n# a dataset\n"
    )
    texts = {}
    for config, split, n in (
        ("kor_Hang", "train", 2),
        ("kor_Hang", "test", 1),
        ("jpn_Jpan", "train", 1),
    ):
        folder = root / "data" / config / split
        folder.mkdir(parents=True)
        for f in range(n):
            rows = [f"{config} {split} {f} 문서 {i} " + "가나다" * 20 for i in range(50)]
            texts.setdefault((config, split), []).extend(rows)
            table = pa.table({"text": rows, "id": [f"<urn:{config}:{f}:{i}>" for i in range(50)]})
            pq.write_table(table, folder / f"{f:03d}_00000.parquet", row_group_size=10)
            meta = root / ".cache" / "huggingface" / "download" / folder.relative_to(root)
            meta.mkdir(parents=True, exist_ok=True)
            (meta / f"{f:03d}_00000.parquet.metadata").write_text(f"{commit}\netag\n1.0\n")
    return texts


def test_a_local_snapshot_is_read_by_its_hf_name_config_and_split(tmp_path):
    texts = snapshot(tmp_path / "fineweb-2")
    spec = f"hf:{tmp_path / 'fineweb-2'}:kor_Hang:train"
    files = dataset_repo.snapshot_files(spec)
    assert [f.relative_to(tmp_path / "fineweb-2").as_posix() for f in files] == [
        "data/kor_Hang/train/000_00000.parquet", "data/kor_Hang/train/001_00000.parquet"]  # fmt: skip
    assert dataset_repo.input_revisions([spec]) == {
        spec: "0123456789abcdef0123456789abcdef01234567"
    }
    units = readers.split_into_units(readers.expand_inputs([spec]), load_config().corpus, 2000)
    assert len(units) > 2 and all(u.nbytes > 0 for u in units)  # row groups with their sizes
    cfg = load_config(values={"corpus.inputs": [spec], "corpus.min_chars": 1})
    stats = run_stage("corpus", cfg, tmp_path / "r")
    assert [t for _, t in output(tmp_path / "r")] == texts[("kor_Hang", "train")]
    assert stats.revisions == {spec: "0123456789abcdef0123456789abcdef01234567"}
    for bad, message in ((f"hf:{tmp_path / 'fineweb-2'}:train", "several configs and none"),
                         (f"hf:{tmp_path / 'fineweb-2'}:kor_Latn:train", "no config 'kor_Latn'"),
                         (f"hf:{tmp_path / 'fineweb-2'}:jpn_Jpan:test", "no split 'test'")):  # fmt: skip
        with pytest.raises(UserError, match=message):
            readers.expand_inputs([bad])


HUB_SHA = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """The Hub, online, as huggingface_hub's fsspec filesystem shows it: a local folder under
    the same paths (datasets/REPO@SHA/...), every revision resolving to HUB_SHA."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(dataset_repo, "hub_commit", lambda repo, revision=None: HUB_SHA)
    monkeypatch.setattr(
        dataset_repo, "hub_filesystem", lambda: DirFileSystem(path=str(root), fs=LocalFileSystem())
    )
    return root


def test_a_hub_dataset_is_read_by_row_group_at_its_commit(tmp_path, fake_hub):
    """hf:REPO:CONFIG:SPLIT on the Hub: its split's parquet files listed at the resolved commit
    through the README's configs, cut into row-group tasks that know their size (task_mb holds,
    the pairs job and the progress bar see bytes), read by range: the same documents as the
    same repository downloaded, and the commit recorded."""
    texts = snapshot(fake_hub / "datasets" / "someone" / f"fw@{HUB_SHA}")
    spec = "hf:someone/fw:kor_Hang:train"
    files = readers.expand_inputs([spec])
    assert files == [f"hf://datasets/someone/fw@{HUB_SHA}/data/kor_Hang/train/{n}_00000.parquet"
                     for n in ("000", "001")]  # fmt: skip
    units = readers.split_into_units(files, load_config().corpus, 2000)
    assert len(units) > 2 and all(u.nbytes > 0 for u in units)
    assert all(u.span is not None for u in units)  # row groups, not whole files
    cfg = load_config(values={"corpus.inputs": [spec], "corpus.min_chars": 1})
    stats = run_stage("corpus", cfg, tmp_path / "r")
    assert [t for _, t in output(tmp_path / "r")] == texts[("kor_Hang", "train")]
    assert stats.revisions == {spec: HUB_SHA}
    from hanlm.plan import data_rates

    sized = data_rates.inputs_bytes([spec], "text")
    assert sized["hub_files"] == 2 and sized["remote"] == []
    assert sized["bytes"] == sum(u.nbytes for u in units)
    with pytest.raises(UserError, match="no config 'kor_Latn'"):
        readers.expand_inputs(["hf:someone/fw:kor_Latn:train"])


def test_a_source_keeps_its_ids_and_metadata_and_filters_read_them(tmp_path):
    """FineWeb-2's columns: the document keeps the row's own id and the metadata asked for;
    min_language_score and corpus.url_blocklist drop what they name, counted, with examples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": f"<urn:uuid:{i}>", "url": url, "language_score": score,
         "text": f"문서 {i}번의 본문은 충분히 길어서 남는다. " * 3}
        for i, (url, score) in enumerate([
            ("https://news.example.kr/a/1", 0.99), ("http://blog.spam.example/post", 0.98),
            ("https://www.spam.example/x", 0.97), ("https://ko.wikipedia.org/wiki/서울", 0.41),
            ("https://news.example.kr/a/2", 0.88)])
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "web.parquet")
    (tmp_path / "blocked.txt").write_text("# spam farms\nspam.example\n")
    source = {"name": "web", "inputs": [str(tmp_path / "web.parquet")],
              "metadata": ["url", "language_score"], "min_language_score": 0.5}  # fmt: skip
    cfg = load_config(values={"corpus.sources": [source], "corpus.min_chars": 1,
                              "corpus.url_blocklist": str(tmp_path / "blocked.txt")})  # fmt: skip
    stats = run_stage("corpus", cfg, tmp_path / "r")
    kept = list(iter_corpus(tmp_path / "r" / "corpus"))
    assert [d["id"] for d in kept] == ["<urn:uuid:0>", "<urn:uuid:4>"]
    assert kept[0]["metadata"] == {"url": "https://news.example.kr/a/1", "language_score": 0.99}
    assert stats.filtered.language_score == 1 and stats.filtered.url_blocklist == 2
    assert stats.filtered.blocked_url_examples == [
        "http://blog.spam.example/post", "https://www.spam.example/x"]  # fmt: skip
    assert stats.sources["web"].quality_filtered == 3
    # a metadata column the file does not have is a clear error
    bad = {**source, "metadata": ["url", "colour"]}
    with pytest.raises(UserError, match="no column 'colour'"):
        run_stage("corpus", load_config(values={"corpus.sources": [bad]}), tmp_path / "r2")


def test_a_changed_snapshot_redoes_the_corpus(tmp_path):
    snapshot(tmp_path / "ds")
    spec = f"hf:{tmp_path / 'ds'}:kor_Hang:test"
    cfg = load_config(values={"corpus.inputs": [spec], "corpus.min_chars": 1})
    run_stage("corpus", cfg, tmp_path / "r")
    from hanlm.stages import corpus as corpus_stage
    from hanlm.stages.rundir import RunDir

    before = corpus_stage.inputs(cfg, RunDir(tmp_path / "r"), {})
    for meta in (tmp_path / "ds" / ".cache").rglob("*.metadata"):
        meta.write_text("f" * 40 + "\n")  # downloaded again at another commit
    assert corpus_stage.inputs(cfg, RunDir(tmp_path / "r"), {}) != before


# --- workers, resuming ---------------------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path, shared_data):
    return corpus_files(tmp_path, shared_data)


def test_one_and_two_workers_write_identical_corpora(tmp_path, inputs):
    one = run_stage("corpus", config(tmp_path, workers=1), tmp_path / "one")
    two = run_stage("corpus", config(tmp_path, workers=2), tmp_path / "two")
    assert one.tasks == two.tasks == 3
    assert one.exact_duplicates > 0 and one.near_duplicates > 0
    assert output(tmp_path / "one") == output(tmp_path / "two")
    assert counts(tmp_path / "one") == counts(tmp_path / "two")
    for part in (tmp_path / "one" / "corpus").glob("part-*"):
        assert part.read_bytes() == (tmp_path / "two" / "corpus" / part.name).read_bytes()
    assert not (tmp_path / "one" / "corpus.work").exists()  # the work folder goes when done


def test_byte_range_tasks_give_the_same_documents_as_whole_files(tmp_path, inputs):
    whole = run_stage("corpus", config(tmp_path, task_mb=64), tmp_path / "whole")
    cut = run_stage("corpus", config(tmp_path, task_mb=1), tmp_path / "cut")
    assert whole.tasks == 3
    # 1 MB tasks would not cut these small files: cut them by hand through the task size
    assert cut.tasks == 3
    units = readers.split_into_units(list(inputs), config(tmp_path).corpus, 20_000)
    assert len(units) > 6
    assert output(tmp_path / "whole") == output(tmp_path / "cut")


def test_a_crashed_run_resumes_without_redoing_finished_tasks(tmp_path, inputs, monkeypatch):
    reference = tmp_path / "reference"
    run_stage("corpus", config(tmp_path), reference)

    original = cleaning.WriteParts.run

    def crash_on_task_1(self, data=None, rank=0, world_size=1):
        if rank == 1:
            raise RuntimeError("power cut")
        return original(self, data, rank, world_size)

    monkeypatch.setattr(cleaning.WriteParts, "run", crash_on_task_1)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="power cut"):
        run_stage("corpus", config(tmp_path), run)
    assert not (run / "corpus").exists()
    work = run / "corpus.work"
    assert sorted(p.name for p in (work / "logs" / "clean" / "completions").iterdir()) == [
        "00000",
        "00001",
        "00002",
    ]
    monkeypatch.setattr(cleaning.WriteParts, "run", original)
    read = []
    original_read = cleaning.ReadUnit.run

    def counting_read(self, data=None, rank=0, world_size=1):
        read.append(rank)
        return original_read(self, data, rank, world_size)

    monkeypatch.setattr(cleaning.ReadUnit, "run", counting_read)
    run_stage("corpus", config(tmp_path), run)
    assert read == []  # every clean task had finished: none read its input again
    assert output(run) == output(reference)
    assert counts(run) == counts(reference)


def test_a_killed_process_resumes_to_the_same_corpus(tmp_path, shared_data):
    corpus_files(tmp_path, shared_data, files=8, docs_per_file=400)
    args = ["corpus", "--run", str(tmp_path / "run"), "--input", str(tmp_path / "in" / "*.jsonl")]
    args += ["--set", "corpus.near_dedup=true", "--set", "data_engine.workers=1"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hanlm", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = tmp_path / "run" / "corpus.work" / "logs" / "clean" / "completions" / "00000"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists(), "the stage did not get as far as its first task"
    assert not (tmp_path / "run" / "corpus").exists(), "it finished before it could be killed"
    result = run_subprocess(*args)
    assert result.returncode == 0, result.stderr
    reference = run_subprocess(
        *[a if a != str(tmp_path / "run") else str(tmp_path / "ref") for a in args]
    )
    assert reference.returncode == 0
    assert output(tmp_path / "run") == output(tmp_path / "ref")
    assert counts(tmp_path / "run") == counts(tmp_path / "ref")


def test_a_bad_record_in_a_worker_process_is_a_user_error(tmp_path, inputs, cli):
    with open(inputs[2], "a", encoding="utf-8") as f:
        f.write("{not json\n")
    run = tmp_path / "run"
    result = cli(
        "corpus", "--run", run, "--input", str(tmp_path / "in" / "*.jsonl"), "--strict",
        "--set", "data_engine.workers=2", "--set", "data_engine.task_mb=1",
    )  # fmt: skip
    assert_user_error(result, "corrupt json", "part2.jsonl")
    assert not (run / "corpus").exists() and not (run / "corpus.work").exists()


def test_work_folder_is_kept_for_the_same_settings_and_emptied_for_others(tmp_path):
    work = engine.prepare_work_dir(tmp_path / "corpus.work", "settings-a")
    (work / "logs" / "clean" / "completions").mkdir(parents=True)
    (work / "logs" / "clean" / "completions" / "00000").touch()
    again = engine.prepare_work_dir(tmp_path / "corpus.work", "settings-a")
    assert (again / "logs" / "clean" / "completions" / "00000").exists()  # resumes
    other = engine.prepare_work_dir(tmp_path / "corpus.work", "settings-b")
    assert list(other.iterdir()) == [other / engine.FINGERPRINT_FILE]  # starts over


def test_changed_settings_do_not_reuse_finished_tasks(tmp_path, inputs, monkeypatch):
    original = cleaning.WriteParts.run

    def crash(self, data=None, rank=0, world_size=1):
        raise RuntimeError("stopped")

    monkeypatch.setattr(cleaning.WriteParts, "run", crash)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        run_stage("corpus", config(tmp_path, **{"corpus.min_chars": 30}), run)
    monkeypatch.setattr(cleaning.WriteParts, "run", original)
    lengths = sorted(len(json.loads(line)["text"]) for f in inputs for line in f.open())
    median = lengths[len(lengths) // 2]
    stats = run_stage("corpus", config(tmp_path, **{"corpus.min_chars": median}), run)
    assert 0 < stats.too_short < stats.documents_in  # the clean tasks ran again


# --- progress ------------------------------------------------------------------------------------


def test_task_counters_add_up(tmp_path):
    a, b = engine.TaskCounter(tmp_path, "clean", 0), engine.TaskCounter(tmp_path, "clean", 1)
    a.add(3, 300)
    b.add(2, 50)
    a.add(1, 100)
    a.flush()
    b.flush()
    assert engine.read_counters(tmp_path, "clean") == (6, 450, 450)
    c = engine.TaskCounter(tmp_path, "encode", 0)
    c.add(2, 300, units=100)  # e.g. characters, when the job's total counts characters
    c.flush()
    assert engine.read_counters(tmp_path, "encode") == (2, 300, 100)


# --- cluster executors ---------------------------------------------------------------------------


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """An `sbatch` that records each submitted script and answers as Slurm does."""
    bin_dir, record = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    record.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(ls "{record}" | wc -l)\n'
        "for last; do :; done\n"
        f'cp "$last" "{record}/$n.slurm"\n'
        f'echo "$@" > "{record}/$n.args"\n'
        'echo "Submitted batch job $((100 + n))"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    hostnames = bin_dir / "scontrol"  # `scontrol show hostnames NODELIST`, as an array task asks
    hostnames.write_text('#!/bin/sh\necho "$3"\n')
    hostnames.chmod(hostnames.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return record


def test_slurm_submits_dependent_array_jobs_and_a_rerun_gathers(tmp_path, inputs, fake_sbatch):
    cfg = config(
        tmp_path, **{"data_engine.executor": "slurm", "data_engine.slurm.partition": "cpu"}
    )
    run = tmp_path / "run"
    assert run_stage("corpus", cfg, run) is None  # submitted, not finished
    scripts = sorted(fake_sbatch.glob("*.slurm"), key=lambda p: int(p.stem))
    pipelines = [s.read_text() for s in scripts if "launch_pickled_pipeline" in s.read_text()]
    assert len(pipelines) == 4  # clean, pairs, clusters, write (and datatrove's stats merges)
    assert all("#SBATCH --partition=cpu" in s and "#SBATCH --array=" in s for s in pipelines)
    args = [p.read_text() for p in sorted(fake_sbatch.glob("*.args"), key=lambda p: int(p.stem))]
    assert sum("--dependency=afterok" in a for a in args) >= 3  # each job waits for the one before

    # the cluster runs the jobs: each array task loads the pickled pipeline, as srun would
    launcher = os.path.join(os.path.dirname(sys.executable), "launch_pickled_pipeline")
    work = run / "corpus.work"
    for job in ("clean", "pairs", "clusters", "write"):
        tasks = json.loads((work / "logs" / job / "ranks_to_run.json").read_text())
        for task in range(len(tasks)):
            env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_NODELIST": "node1"}
            subprocess.run(
                [launcher, str(work / "logs" / job / "executor.pik")], env=env, check=True
            )
    stats = run_stage("corpus", cfg, run)
    assert stats is not None and stats.documents_out > 0
    local = tmp_path / "local"
    run_stage("corpus", config(tmp_path), local)
    assert output(run) == output(local)


def test_slurm_without_a_partition_is_a_user_error(tmp_path, inputs):
    with pytest.raises(UserError, match="partition"):
        run_stage("corpus", config(tmp_path, **{"data_engine.executor": "slurm"}), tmp_path / "r")


def test_ray_executor(tmp_path, inputs):
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match=r"hanlm\[ray\]"):
            run_stage("corpus", config(tmp_path, **{"data_engine.executor": "ray"}), tmp_path / "r")
        return
    stats = run_stage("corpus", config(tmp_path, **{"data_engine.executor": "ray"}), tmp_path / "r")
    run_stage("corpus", config(tmp_path), tmp_path / "local")
    assert stats.documents_out > 0 and output(tmp_path / "r") == output(tmp_path / "local")


@pytest.mark.parametrize(
    "task_share, group_share, pairs_tasks",
    [
        (0.5, 0.5, lambda kinds: kinds * 2),  # each kind (content hashes, bands) in 2 ranges
        (4.0, 4.0, lambda kinds: -(-kinds // 4)),  # 4 kinds to a task
        (4.0, 16.0, lambda kinds: -(-kinds // 16)),  # grouped by PAIRS_GROUP_BYTES
    ],
)
def test_pairs_tasks_cut_or_grouped_find_the_same_duplicates(
    tmp_path, inputs, monkeypatch, task_share, group_share, pairs_tasks
):
    cfg = config(tmp_path)
    units = readers.split_into_units(list(inputs), cfg.corpus, cfg.data_engine.task_mb << 20)
    input_bytes = sum(u.nbytes for u in units)
    kinds = 1 + lsh_bands(cfg.corpus.near_dedup_threshold, cfg.corpus.near_dedup_num_perm)[0]

    def pairs_job():
        jobs = cleaning.jobs(units, cfg.corpus, cfg.run.seed, tmp_path / "w", None)
        return next(job for job in jobs if job.name == cleaning.PAIRS)

    assert pairs_job().tasks == 1  # a small input: every kind in one task
    whole = run_stage("corpus", cfg, tmp_path / "whole")
    monkeypatch.setattr(cleaning, "PAIRS_TASK_BYTES", math.ceil(input_bytes * task_share))
    monkeypatch.setattr(cleaning, "PAIRS_GROUP_BYTES", math.ceil(input_bytes * group_share))
    assert pairs_job().tasks == pairs_tasks(kinds)
    cut = run_stage("corpus", cfg, tmp_path / "cut")
    assert cut.job_seconds.keys() == whole.job_seconds.keys()
    assert output(tmp_path / "whole") == output(tmp_path / "cut")
    assert counts(tmp_path / "whole") == counts(tmp_path / "cut")


def test_progress_bar_shows_rates_and_tasks(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(engine, "console", Console(file=out, force_terminal=True, width=150))
    job = engine.Job("clean", [], tasks=2)
    counter = engine.TaskCounter(tmp_path, "clean", 0)
    counter.add(120, 3_000_000)
    counter.flush()
    (tmp_path / "logs" / "clean" / "completions").mkdir(parents=True)
    (tmp_path / "logs" / "clean" / "completions" / "00000").touch()
    progress = engine.Progress(tmp_path, "corpus", {"clean": 6_000_000})
    progress.start(job)
    time.sleep(1.2)
    progress.stop()
    shown = out.getvalue()
    assert "corpus clean" in shown and "1/2 tasks" in shown
    assert "120 docs" in shown and "docs/s" in shown and "MB/s" in shown
