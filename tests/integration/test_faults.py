"""Faults never cost data: a table of the faults a practitioner on a rented host meets.

Each case puts a run folder in a fault (a kill inside a commit, a second command, damaged bytes
in a finished output, a full or read-only disk, a torn JSONL line, a signal) and asserts what a
user is promised: exit status 2 with one message and no traceback where the fault is the
user's to fix, nothing lost, and an identical result once the fault is removed. Training faults
(a diverging loss, a failing checkpoint disk) are in tests/integration/test_training_faults.py; a huge
document in tests/integration/test_shards.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_user_error, copy_data_run, run_subprocess
from hanlm import exit_status, files, run_lock
from hanlm.errors import UserError
from hanlm.files import (
    IN_PROGRESS_TAG,
    STAGE_MARKER,
    atomic_output_dir,
    read_jsonl,
    recover_interrupted_commit,
)
from hanlm.stages.markers import write_stage_marker

# what records when and how fast a stage ran, besides what it made
TIMED_FILES = {STAGE_MARKER, "stats.json", "report.json", "report.md", "manifest.json"}


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256), the files that record timings
    aside."""
    out = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.name not in TIMED_FILES:
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def run_copy(demo_run, tmp_path) -> Path:
    """A private copy of the finished data run (corpus, decontam, tokenizer, shards)."""
    return copy_data_run(demo_run, tmp_path / "run")


# ---------------------------------------------------------------------------------------------
# A kill at every instant of a commit leaves the earlier output or the new one


COMMIT_STEPS = ("replace", "unlink", "rmtree", "_exchange", "fsync_dir", "_fsync_tree")


def _write(final: Path, text: str) -> None:
    with atomic_output_dir(final) as tmp:
        (tmp / "result.txt").write_text(text)
        write_stage_marker(tmp, "test", text)


def _killed_commit(final: Path, kill_at: int, exchange: bool) -> bool:
    """Commit "new" over `final` in a forked child that dies (os._exit, as SIGKILL would: no
    cleanup) at its `kill_at`-th filesystem step; whether it died before finishing."""
    pid = os.fork()
    if pid == 0:  # the child: count the steps, die at the chosen one
        calls = [0]

        def counting(name, real):
            def step(*args, **kwargs):
                calls[0] += 1
                if calls[0] == kill_at:
                    os._exit(9)
                return real(*args, **kwargs)

            return step

        files.os.replace = counting("replace", os.replace)
        files.shutil.rmtree = counting("rmtree", shutil.rmtree)
        files.fsync_dir = counting("fsync_dir", files.fsync_dir)
        files._fsync_tree = counting("_fsync_tree", files._fsync_tree)
        files._exchange = counting("_exchange", files._exchange if exchange else lambda a, b: False)
        Path.unlink = counting("unlink", Path.unlink)
        _write(final, "new")
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 9


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_a_kill_at_any_instant_of_a_commit_leaves_old_or_new(tmp_path, exchange):
    outcomes = set()
    for kill_at in range(1, 40):
        case = tmp_path / f"kill-{kill_at}"
        final = case / "out"
        _write(final, "old")
        died = _killed_commit(final, kill_at, exchange)
        # what a reader sees right after the kill: the old or the new output, or (only between
        # the fallback's two renames) the old one moved aside, which recovery puts back
        recover_interrupted_commit(final)
        text = (final / "result.txt").read_text()
        assert text in ("old", "new"), kill_at
        assert not (final / IN_PROGRESS_TAG).exists()
        outcomes.add(text)
        _write(final, "next")  # the next run is never refused, and leaves nothing behind
        assert (final / "result.txt").read_text() == "next"
        assert sorted(p.name for p in case.iterdir()) == ["out"], kill_at
        if not died:
            break
    else:
        pytest.fail("the commit never finished within 40 steps")
    assert outcomes == {"old", "new"}  # the kill points covered both sides of the swap


def test_an_interrupted_stage_commit_is_recovered_and_its_work_kept(run_copy, cli):
    """A kill between the fallback's two renames: corpus/ moved aside, corpus.incomplete/
    complete but not in place, corpus.work/ resumable. The next command puts the earlier
    output back (so the stage is up to date) and never refuses or deletes the work."""
    before = tree_digest(run_copy / "corpus")
    shutil.copytree(run_copy / "corpus", run_copy / "corpus.incomplete")
    os.replace(run_copy / "corpus", run_copy / "corpus.replaced")
    (run_copy / "shards.work").mkdir()
    (run_copy / "shards.work" / "fingerprint").write_text("from an interrupted run\n")
    result = cli("run", "--run", run_copy, "--until", "shards")
    assert result.code == 0, result.err
    assert "up to date" in result.err or "skipped" in result.err + result.out
    assert tree_digest(run_copy / "corpus") == before
    leftovers = [p.name for p in run_copy.iterdir() if p.suffix in (".incomplete", ".replaced")]
    assert leftovers == [] and not (run_copy / "shards.work").exists()


def test_something_not_hanlms_at_a_temporary_name_is_refused_and_kept(run_copy, cli):
    users = run_copy / "tokenizer.incomplete"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    result = cli("tokenizer", "--run", run_copy, "--force")
    assert_user_error(result, "tokenizer.incomplete is in the way")
    assert (users / "notes.txt").read_text() == "mine"
    # the corpus stage's refusal keeps the work an interrupted run left to resume
    shutil.rmtree(run_copy / "corpus")
    (run_copy / "corpus.incomplete").mkdir()
    (run_copy / "corpus.incomplete" / "notes.txt").write_text("mine")
    work = run_copy / "corpus.work"
    work.mkdir()
    (work / "fingerprint").write_text("an interrupted run's\n")
    first = cli("corpus", "--run", run_copy, "--set", "data_engine.workers=1")
    assert_user_error(first, "corpus.incomplete is in the way")
    assert (work / "fingerprint").read_text() == "an interrupted run's\n"


def test_a_symlinked_stage_folder_is_rebuilt_where_it_points(run_copy, cli, tmp_path):
    """A stage folder moved to another disk and linked back keeps its link when rebuilt."""
    elsewhere = tmp_path / "other-disk" / "tokenizer"
    elsewhere.parent.mkdir()
    shutil.move(run_copy / "tokenizer", elsewhere)
    (run_copy / "tokenizer").symlink_to(elsewhere)
    before = tree_digest(elsewhere)
    result = cli("tokenizer", "--run", run_copy, "--force")
    assert result.code == 0, result.err
    assert (run_copy / "tokenizer").resolve() == elsewhere.resolve()
    assert tree_digest(elsewhere) == before
    assert [p.name for p in elsewhere.parent.iterdir()] == ["tokenizer"]
    assert not [p for p in run_copy.iterdir() if p.name.startswith("tokenizer.")]


# ---------------------------------------------------------------------------------------------
# One command at a time per run folder

HOLDER = """
import sys, time
from hanlm import run_lock
with run_lock.hold(sys.argv[1], "hanlm pretrain --run X"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_command_is_refused_naming_the_holder_and_a_dead_ones_lock_is_taken(run_copy, cli):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_copy)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree_digest(run_copy)
        result = cli("shards", "--run", run_copy, "--force")
        assert_user_error(result, "in use by another hanlm command", f"PID {holder.pid}")
        assert "hanlm pretrain --run X" in result.err and "started" in result.err
        assert tree_digest(run_copy) == before
    finally:
        holder.kill()  # SIGKILL: no cleanup, the lock file stays behind
        holder.wait()
    assert (run_copy / run_lock.LOCK_FILE).is_file()
    result = cli("shards", "--run", run_copy)  # the kernel released the dead holder's lock
    assert result.code == 0, result.err


def test_the_same_process_takes_its_lock_again_and_leaves_the_folder_as_it_was(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with run_lock.hold(run), run_lock.hold(run):  # the pipeline re-enters the CLI's lock
        assert (run / run_lock.LOCK_FILE).is_file()
        holder = json.loads((run / run_lock.LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
    assert list(run.iterdir()) == []  # released and removed
    with run_lock.hold(run):  # taken again
        assert (run / run_lock.LOCK_FILE).is_file()
    with run_lock.hold(tmp_path / "new"):  # a folder the command made and left empty goes
        pass
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------
# Damaged bytes in finished outputs: verified on skip, the owning stage redone


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if offset is None else offset
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    # name: (file to damage, stage named in the warning)
    "corpus part": ("corpus/part-*", "corpus"),
    "decontaminated part": ("decontam/corpus/part-*", "decontam"),
    "decontam index": ("decontam/index.npz", "decontam"),
    "tokenizer": ("tokenizer/tokenizer.json", "tokenizer"),
    "shard": ("shards/train-*.bin", "shards"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_same_size_damage_is_found_and_the_output_made_again(run_copy, cli, kind):
    pattern, stage = DAMAGE[kind]
    target = sorted(run_copy.glob(pattern))[0]
    before = tree_digest(run_copy / target.relative_to(run_copy).parts[0])
    _flip_byte(target)
    result = cli("run", "--run", run_copy, "--until", "shards")
    assert result.code == 0, result.err
    assert f"{stage}: " in result.err and "is damaged" in result.err, result.err
    assert tree_digest(run_copy / target.relative_to(run_copy).parts[0]) == before


def test_training_refuses_damaged_shards_with_the_rebuild(run_copy, cli):
    from conftest import TINY_PRETRAIN

    _flip_byte(sorted(run_copy.glob("shards/train-*.bin"))[0])
    flags = [a for k, v in TINY_PRETRAIN.items() for a in ("--set", f"{k}={v}")]
    result = cli("pretrain", "--run", run_copy, *flags)
    assert_user_error(result, "shards", "are damaged", "fails its sha256", "--force")
    assert not (run_copy / "pretrain" / STAGE_MARKER).exists()


def test_a_stage_reading_a_damaged_corpus_names_the_stage_that_makes_it(run_copy, cli):
    _flip_byte(sorted(run_copy.glob("decontam/corpus/part-*"))[0])
    result = cli("tokenizer", "--run", run_copy, "--force")
    assert_user_error(result, "output of the decontam stage, is damaged", "hanlm decontam")
    assert "download" not in result.err


# ---------------------------------------------------------------------------------------------
# A disk that cannot take the output: a UserError, nothing half-written looking complete


@pytest.mark.parametrize(
    "code,needle",
    [
        (errno.ENOSPC, "no space left on the device"),
        (errno.EROFS, "mounted read-only"),
        (errno.EACCES, "permission denied"),
        (errno.EDQUOT, "quota"),
    ],
)
def test_a_failing_disk_is_a_user_error(run_copy, cli, monkeypatch, code, needle):
    import hanlm.data.tokenizer as tokenizer_lib

    real = tokenizer_lib.atomic_write_json

    def failing(path, obj):
        raise OSError(code, os.strerror(code), str(path))

    before = tree_digest(run_copy / "tokenizer")
    monkeypatch.setattr(tokenizer_lib, "atomic_write_json", failing)
    result = cli("tokenizer", "--run", run_copy, "--force")
    assert_user_error(result, needle, "cannot write", "tokenizer")
    assert tree_digest(run_copy / "tokenizer") == before  # the earlier output is intact
    assert not (run_copy / "tokenizer.incomplete").exists()
    monkeypatch.setattr(tokenizer_lib, "atomic_write_json", real)
    assert cli("tokenizer", "--run", run_copy, "--force").code == 0
    assert tree_digest(run_copy / "tokenizer") == before


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here (needs root): {done.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MB tmpfs: the demo run (about 4 MB) fits, a second copy of its corpus does not."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    _mount("-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount_point))
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_stops_with_the_free_space_and_resumes_once_freed(demo_run, small_disk):
    run_dir = copy_data_run(demo_run, small_disk / "run")
    before = tree_digest(run_dir / "corpus")
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * max(free - 64 * 1024, 0))
    result = run_subprocess("corpus", "--run", run_dir, "--force")
    assert_user_error(result, "no space left on the device", "free of 6.3 MB", "larger disk")
    assert tree_digest(run_dir / "corpus") == before  # the finished corpus is untouched
    filler.unlink()
    result = run_subprocess("corpus", "--run", run_dir, "--force")
    assert result.returncode == 0, result.stderr
    assert tree_digest(run_dir / "corpus") == before


def test_a_read_only_mount_reruns_up_to_date_stages_and_refuses_writes(demo_run, tmp_path):
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    source = copy_data_run(demo_run, tmp_path / "run")
    mounted = tmp_path / "ro"
    mounted.mkdir()
    _mount("--bind", str(source), str(mounted))
    try:
        _mount("-o", "remount,ro,bind", str(mounted))
        result = run_subprocess("shards", "--run", mounted)  # up to date: nothing to write
        assert result.returncode == 0, result.stderr
        result = run_subprocess("shards", "--run", mounted, "--force")
        assert_user_error(result, "mounted read-only", "writable disk")
        result = run_subprocess("run", "--run", mounted, "--until", "shards")
        assert_user_error(result, "the filesystem is mounted read-only")
        assert f"{mounted / 'preflight'}" in result.stderr
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False)


# ---------------------------------------------------------------------------------------------
# Torn and damaged JSONL


def test_a_torn_last_line_is_dropped_and_a_damaged_middle_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"step": 2}')  # complete, only its newline missing
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(files.DamagedFile, match="line 2 is not valid JSON") as caught:
        read_jsonl(path)
    assert caught.value.where == f"{path}:2"


def test_the_report_reads_a_torn_metrics_log_and_names_a_damaged_one(run_copy):
    from hanlm.pipeline import run_stage
    from hanlm.stages.rundir import load_run_config

    metrics = run_copy / "pretrain" / "metrics.jsonl"
    metrics.parent.mkdir()
    rows = [
        {"step": s, "loss": 5.0 - s, "tokens": 512 * s, "lr": 1e-3, "grad_norm": 1.0,
         "tokens_per_s": 100.0, "mfu": None, "peak_memory_gb": 0.5}
        for s in (1, 2)
    ]  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in rows)
    metrics.write_text(text + '{"step": 3, "lo')  # a crash in the middle of a write
    cfg = load_run_config(run_copy)
    run_stage("report", cfg, run_copy)
    assert (run_copy / "report.md").is_file()
    metrics.write_text('{"step": 1, "lo\n' + text)  # damaged where no write was under way
    with pytest.raises(files.DamagedFile, match="line 1 is not valid JSON") as caught:
        run_stage("report", cfg, run_copy)
    assert caught.value.where == f"{metrics}:1"


def test_the_report_names_a_damaged_result_file_and_the_stage_that_makes_it(run_copy):
    """A result file cut short (a disk that filled, a copy that stopped) is named with what is
    wrong and how to make it again, and no card is written from it."""
    from hanlm.pipeline import run_stage
    from hanlm.stages.rundir import load_run_config

    results = run_copy / "eval" / "results.json"
    results.parent.mkdir()
    whole = '{"models": ["run/pretrain"], "model_dirs": {"run/pretrain": "pretrain/hf"}}'
    results.write_text(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="the EvalResults file is damaged: not JSON") as caught:
        run_stage("report", load_run_config(run_copy), run_copy)
    assert caught.value.where == str(results) and "--from eval" in caught.value.fix
    assert not (run_copy / "report.md").exists()


# ---------------------------------------------------------------------------------------------
# Signals during a data stage


def _start(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hanlm", "corpus", "--run", str(run_dir), "--force",
         "--workers", "2", "--set", "corpus.part_chars=2000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_for_workers(process: subprocess.Popen, deadline_s: float = 30) -> list[int]:
    """The PIDs of the stage's data-engine processes (the executor's process and the workers
    it forks) once the workers have started."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and process.poll() is None:
        executors = _children(process.pid)
        workers = [w for e in executors for w in _children(e)]
        if workers:
            return executors + workers
        time.sleep(0.05)
    pytest.fail("the corpus stage started no worker processes")


def test_sigterm_during_a_data_stage_says_so_and_the_rerun_completes(run_copy):
    before = tree_digest(run_copy / "corpus")
    process = _start(run_copy)
    _wait_for_workers(process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == exit_status.STOPPED, err
    assert "stopped by a signal" in err and "Traceback" not in err
    assert tree_digest(run_copy / "corpus") == before  # the earlier output is still in place
    result = run_subprocess("corpus", "--run", run_copy, "--workers", "2")
    assert result.returncode == 0, result.stderr


def test_killing_the_stage_process_stops_its_workers(run_copy):
    process = _start(run_copy)
    workers = _wait_for_workers(process)
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = [w for w in workers if Path(f"/proc/{w}").exists() and not _zombie(w)]
        time.sleep(0.05)
    assert not alive, f"workers {alive} outlived the killed stage"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_sigterm_whose_unwinding_hangs_still_ends_the_process():
    """The exception SIGTERM raises can meet code that never lets it through (multiprocessing's
    pool caught in a lock or join): after the grace period the process ends anyway, 75."""
    script = (
        "import os, signal, time\n"
        "from hanlm.cli import process\n"
        "from hanlm.errors import Terminated\n"
        "process.STOP_GRACE_S = 1.0\n"
        "signal.signal(signal.SIGTERM, process._terminated_handler(os.getpid()))\n"
        "ready = False\n"
        "while True:\n"
        "    try:\n"
        "        if not ready:\n"
        "            print('ready', flush=True)\n"
        "            ready = True\n"
        "        time.sleep(0.05)\n"
        "    except Terminated:\n"
        "        ready = True  # swallowed, as a stuck join would\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "ready"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == exit_status.STOPPED, err
    assert "stopped by a signal" in err and "forced after 1 s" in err
    assert time.monotonic() - started < 10


def test_a_sigterm_while_a_pool_forks_stops_right_after_the_fork():
    from hanlm.errors import Terminated, sigterm_deferred, stop_on_sigterm

    reached = []
    with pytest.raises(Terminated), sigterm_deferred():
        stop_on_sigterm()  # the handler, during the fork: nothing raised here
        reached.append("fork done")
    assert reached == ["fork done"]
    with pytest.raises(Terminated):
        stop_on_sigterm()  # outside: at once
    with sigterm_deferred():  # nothing pending: nothing raised
        pass
