import json

import pytest

from conftest import assert_user_error, run_subprocess
from user_files import snapshot, user_file, user_folder


def test_help_explains_every_command():
    result = run_subprocess("--help")
    assert result.returncode == 0
    for command in ("run", "corpus", "tokenizer", "shards", "demo"):
        assert command in result.stdout
        sub = run_subprocess(command, "--help")
        assert sub.returncode == 0
        assert "--run" in sub.stdout or command == "demo"


def test_bad_override_exits_2_without_traceback(tmp_path):
    result = run_subprocess("corpus", "--run", tmp_path / "r", "--set", "corpus.nope=1")
    assert_user_error(result, "corpus.nope", "inputs")


def test_argparse_errors_exit_2(tmp_path):
    result = run_subprocess("shards", "--workers", "two")
    assert result.returncode == 2 and "invalid int value" in result.stderr


def test_run_pipeline_resumes_and_redoes_from_a_stage(tmp_path, cli):
    run = tmp_path / "run"
    args = ["--run", run, "--until", "shards", "--set", "demo.size_mb=0.15"]
    args += ["--set", "tokenizer.vocab_size=512"]
    assert cli("run", *args).code == 0
    for stage in ("corpus", "tokenizer", "shards"):
        assert (run / stage / "stage.json").is_file()
    config = (run / "config.toml").read_text()
    assert "size_mb = 0.15" in config
    markers = {s: (run / s / "stage.json").read_text() for s in ("corpus", "tokenizer", "shards")}

    # A second run with the run's own config skips every finished stage.
    result = cli("run", "--run", run, "--until", "shards")
    assert result.code == 0
    assert all((run / s / "stage.json").read_text() == markers[s] for s in markers)

    # --from redoes that stage and the later ones, not the earlier ones.
    assert cli("run", "--run", run, "--from", "tokenizer", "--until", "shards").code == 0
    assert (run / "corpus" / "stage.json").read_text() == markers["corpus"]
    assert (run / "tokenizer" / "stage.json").read_text() != markers["tokenizer"]
    assert (run / "shards" / "stage.json").read_text() != markers["shards"]
    assert_user_error(cli("run", "--run", run, "--from", "nowhere"), "unknown stage")
    assert_user_error(cli("run", "--run", run, "--from", "shards", "--until", "corpus"), "swap")


def test_demo_command_writes_the_world(tmp_path, cli):
    out = tmp_path / "world"
    assert cli("demo", "--out", out, "--size-mb", "0.1").code == 0
    for name in ("pretrain.jsonl", "benchmark.jsonl", "chat.jsonl", "facts.tsv", "planted.json"):
        assert (out / name).is_file()
    first = json.loads((out / "pretrain.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first["text"]
    assert_user_error(cli("demo", "--out", out, "--size-mb", "0"), "--size-mb")


def test_korquad_through_all_stages(tmp_path, shared_data, cli):
    """The real Korean data set through corpus, tokenizer and shards from the command line."""
    data = json.loads((shared_data / "korquad" / "KorQuAD_v1.0_dev.json").read_text())
    src = tmp_path / "korquad.txt"
    paragraphs = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    src.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    run = tmp_path / "kq"
    base = ["--run", run, "--set", "tokenizer.vocab_size=2048"]
    assert cli("corpus", *base, "--input", src, "--set", "corpus.part_chars=100000").code == 0
    assert cli("tokenizer", *base).code == 0
    assert cli("shards", *base, "--workers", "2").code == 0
    from hanlm.data.corpus import CorpusStats
    from hanlm.data.shards import ShardsManifest

    splits = ShardsManifest.read(run / "shards" / ShardsManifest.FILE).splits
    stats = CorpusStats.read(run / "corpus" / CorpusStats.FILE)
    assert splits["train"].documents + splits["val"].documents == stats.documents_out
    assert stats.documents_out > 900


# --- paths a user names: errors, never tracebacks, and nothing of theirs lost ----------------

# Every command that takes --run, with the arguments it needs to get as far as the run directory.
COMMANDS_WITH_RUN = [
    ["run"],
    ["corpus"],
    ["decontam"],
    ["tokenizer"],
    ["shards"],
    ["pretrain"],
    ["export"],
    ["sft"],
    ["eval"],
    ["preflight"],
    ["plan", "--preset", "tiny", "--gpu", "cpu"],
    ["generate", "some_model", "--prompt", "x"],
    ["chat", "some_model"],
]


@pytest.mark.parametrize("command", COMMANDS_WITH_RUN, ids=lambda c: c[0])
def test_run_that_is_a_file_is_an_error(command, cli, tmp_path):
    run = user_file(tmp_path / "run")
    before = snapshot(tmp_path)
    assert_user_error(cli(*command, "--run", run), "is a file, not a folder")
    assert_user_error(cli(*command, "--run-dir", run / "inside"), "cannot be created")
    assert snapshot(tmp_path) == before


def test_decontam_out_that_is_a_file_or_holds_a_users_results_folder(cli, tmp_path):
    corpus = user_file(tmp_path / "corpus.txt")
    file = user_file(tmp_path / "out")
    mine = user_folder(tmp_path / "mine" / "decontam")  # where the results would go
    before = snapshot(tmp_path)
    scan = ("decontam", "--corpus", corpus, "--benchmark", "demo_qa=demo")
    assert_user_error(cli(*scan, "--out", file), "is a file, not a folder")
    assert_user_error(cli(*scan, "--out", file / "inside"), "cannot be created")
    assert_user_error(cli("decontam", "merge", "--out", file), "is a file, not a folder")
    for force in ([], ["--force"]):
        assert_user_error(cli(*scan, "--out", mine.parent, *force), "hanlm did not write")
    assert snapshot(tmp_path) == before


def test_generate_and_plan_keep_a_users_file_at_out(cli, tmp_path):
    answers = user_file(tmp_path / "answers.jsonl")
    plan_file = user_file(tmp_path / "plan.json")
    before = snapshot(tmp_path)
    generate = ("generate", tmp_path / "no_model", "--prompt", "x", "--run", tmp_path / "r")
    plan = ("plan", "--preset", "tiny", "--gpu", "cpu")
    for force in ([], ["--force"]):
        assert_user_error(cli(*generate, "--out", answers, *force), "not hanlm's output")
        assert_user_error(cli(*plan, "--out", plan_file, *force), "not hanlm's output")
    assert_user_error(cli(*generate, "--out", tmp_path), "is a folder, not a file")
    assert_user_error(cli(*plan, "--out", answers / "plan.json"), "cannot be created")
    assert snapshot(tmp_path) == before


def test_plan_out_replaces_an_earlier_plan_only_with_force(cli, tmp_path):
    out = tmp_path / "plan.json"
    plan = ("plan", "--preset", "tiny", "--gpu", "cpu", "--out", out)
    assert cli(*plan).code == 0
    before = snapshot(out)
    assert_user_error(cli(*plan, "--tokens", "1e6"), "earlier output", "--force")
    assert snapshot(out) == before
    assert cli(*plan, "--tokens", "1e6", "--force").code == 0
    assert json.loads(out.read_text())["setup"]["tokens"] == 1e6


def test_demo_out_keeps_a_users_files(cli, tmp_path):
    out = user_folder(tmp_path / "folder")
    user_file(out / "chat.jsonl")  # a file of the same name as one of the world's
    before = snapshot(tmp_path)
    for force in ([], ["--force"]):
        result = cli("demo", "--out", out, "--size-mb", "0.05", *force)
        assert_user_error(result, "chat.jsonl already exists and is not hanlm's output")
    assert_user_error(cli("demo", "--out", out / "README.md"), "is a file, not a folder")
    assert snapshot(tmp_path) == before
    (out / "chat.jsonl").unlink()
    before = snapshot(out / "README.md", out / "notes")
    assert cli("demo", "--out", out, "--size-mb", "0.05").code == 0  # next to the user's files
    assert snapshot(out / "README.md", out / "notes") == before
    world = snapshot(out)
    assert_user_error(cli("demo", "--out", out, "--seed", "1", "--size-mb", "0.05"), "--force")
    assert snapshot(out) == world
    assert cli("demo", "--out", out, "--seed", "1", "--size-mb", "0.05", "--force").code == 0
    assert snapshot(out) != world
    assert snapshot(out / "README.md", out / "notes") == before


def test_help_prints_no_torchao_noise():
    result = run_subprocess("--help")  # a model-loading command is checked in test_generate
    assert result.returncode == 0
    assert "Failed to load" not in result.stderr and "register_constant" not in result.stderr
