import json

from conftest import assert_user_error, run_subprocess


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
    manifest = json.loads((run / "shards" / "manifest.json").read_text())
    stats = json.loads((run / "corpus" / "stats.json").read_text())
    splits = manifest["splits"]
    assert splits["train"]["documents"] + splits["val"]["documents"] == stats["documents_out"]
    assert stats["documents_out"] > 900
