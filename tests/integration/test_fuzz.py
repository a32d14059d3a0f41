"""Bad input never costs data: every command against a table of bad inputs.

Each case builds its inputs in a fresh folder, runs `hanlm ...` in-process and asserts what a user
is promised: exit status 2, one message (what, where, how to fix) and no traceback, no stage marked
complete, and every file that was there before left byte for byte as it was. Property-based tests
then throw random bytes at the benchmark readers and random TOML at the config loader: the answer
is a result or a UserError, never anything else.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard

from damaged_models import DAMAGES
from hanlm.errors import UserError
from hanlm.pipeline import run_stage

# ---------------------------------------------------------------------------------------------
# Inputs the cases share: a finished data run (read-only) and a tiny model folder


@pytest.fixture(scope="module")
def model_dir(demo_run, tmp_path_factory) -> Path:
    """A randomly initialised tiny model with the demo run's tokenizer: loads, generates."""
    from hanlm.model import build_model, model_config

    tokenizer = demo_run / "tokenizer"
    vocab = json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    out = tmp_path_factory.mktemp("fuzz-model") / "model"
    model = build_model(model_config("tiny", vocab_size=max(len(vocab), 1024), seq_len=64))
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens.json"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, out / name)
    return out


@pytest.fixture(scope="module")
def trained_run(demo_run, tmp_path_factory) -> Path:
    """The data run pretrained for 2 tiny steps: one committed checkpoint, step 2."""
    from conftest import TINY_PRETRAIN
    from hanlm.stages.rundir import load_run_config

    run_dir = tmp_path_factory.mktemp("fuzz-trained") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    values = {**TINY_PRETRAIN, "pretrain.max_steps": 2, "checkpoint.every": 2,
              "logging.eval_every": 2}  # fmt: skip
    run_stage("pretrain", load_run_config(run_dir, values=values), run_dir)
    return run_dir


@dataclass
class World:
    tmp: Path
    demo_run: Path
    model_dir: Path
    trained_run: Path

    def trained_copy(self) -> Path:
        target = self.tmp / "trained"
        shutil.copytree(self.trained_run, target)
        return target

    def uncommitted_checkpoint(self) -> Path:
        """A trained run with a second, uncommitted checkpoint (step 4, no manifest) whose
        tensor file is cut short: what a crash in the middle of a save leaves."""
        run = self.trained_copy()
        checkpoints = run / "pretrain" / "checkpoints"
        broken = checkpoints / "step-00000004"
        shutil.copytree(checkpoints / "step-00000002", broken)
        (broken / "manifest.json").unlink()
        for part in broken.glob("*.distcp"):
            part.write_bytes(part.read_bytes()[:100])
        return run

    def file(self, name: str, data: bytes | str) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    def folder(self, name: str, **files: str) -> Path:
        path = self.tmp / name
        path.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (path / file).write_text(text)
        return path

    def run_copy(self, *without: str) -> Path:
        """A copy of the finished data run, less the named stage folders."""
        target = self.tmp / "run"
        shutil.copytree(self.demo_run, target, ignore=shutil.ignore_patterns(*without))
        return target

    def model_copy(self, corrupt: Callable[[Path], None] | None = None) -> Path:
        target = self.tmp / "model"
        shutil.copytree(self.model_dir, target)
        if corrupt:
            corrupt(target)
        return target


# Damaged model folders: the shared damages, and one more


def no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


MODEL_DAMAGE = {name.replace(" ", "-"): damage for name, (damage, _) in DAMAGES.items()}
MODEL_DAMAGE["no-weights"] = no_weights


# Damaged data files


def truncated_zst(w: World, name: str = "data.jsonl.zst") -> Path:
    rows = "".join(json.dumps({"text": "한국어 문서 " * 40 + str(i)}) + "\n" for i in range(200))
    data = zstandard.ZstdCompressor().compress(rows.encode())
    return w.file(name, data[: len(data) // 2])


def truncated_gz(w: World, name: str = "data.jsonl.gz") -> Path:
    rows = "".join(json.dumps({"text": "한국어 문서 " * 40 + str(i)}) + "\n" for i in range(200))
    data = gzip.compress(rows.encode())
    return w.file(name, data[: len(data) // 2])


BINARY = bytes(range(256)) * 8


@dataclass
class Case:
    name: str
    argv: Callable[[World], list]


def _cases() -> list[Case]:
    cases: list[Case] = []

    def case(name: str):
        def add(fn):
            cases.append(Case(name, fn))
            return fn

        return add

    # --- configuration, for any command ---
    case("config-missing")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--config", w.tmp / "no.toml"]
    )
    case("config-is-folder")(lambda w: ["corpus", "--run", w.tmp / "r", "--config", w.folder("cf")])
    case("config-bad-toml")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--config", w.file("c.toml", "[corpus\nx=")]
    )
    case("config-binary")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--config", w.file("c.toml", BINARY)]
    )
    case("config-unknown-key")(
        lambda w: [
            "corpus",
            "--run",
            w.tmp / "r",
            "--config",
            w.file("c.toml", "[corpus]\nbogus = 1\n"),
        ]
    )
    case("config-wrong-type")(
        lambda w: [
            "corpus",
            "--run",
            w.tmp / "r",
            "--config",
            w.file("c.toml", "[corpus]\nmin_chars = 'x'\n"),
        ]
    )
    for name, extra in (("config-source-unknown-key", 'colour = "blue"\n'),
                        ("config-source-bad-value", "min_chars = 'x'\n")):  # fmt: skip
        table = f'[[corpus.sources]]\nname = "web"\ninputs = ["a.jsonl"]\n{extra}'
        case(name)(lambda w, table=table: ["corpus", "--run", w.tmp / "r", "--config",
                                           w.file("c.toml", table)])  # fmt: skip
    case("set-unknown-key")(lambda w: ["corpus", "--run", w.tmp / "r", "--set", "corpus.bogus=1"])
    case("set-no-equals")(lambda w: ["corpus", "--run", w.tmp / "r", "--set", "corpus.min_chars"])
    case("set-bad-value")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--set", "corpus.min_chars=abc"]
    )
    case("set-unknown-section")(lambda w: ["tokenizer", "--run", w.tmp / "r", "--set", "nope.x=1"])
    case("recipe-unknown")(lambda w: ["run", "--run", w.tmp / "r", "--config", "no-such-recipe"])
    case("run-from-unknown-stage")(lambda w: ["run", "--run", w.tmp / "r", "--from", "nope"])

    # --- --run pointing at a file, for every stage that takes it ---
    for command in (
        "corpus",
        "tokenizer",
        "shards",
        "pretrain",
        "export",
        "sft",
        "decontam",
        "run",
    ):
        case(f"{command}-run-is-a-file")(
            lambda w, c=command: [c, "--run", w.file("notes.txt", "my notes\n")]
        )

    # --- corpus ---
    case("corpus-input-missing")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--input", w.tmp / "none/*.jsonl"]
    )
    case("corpus-input-empty")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--input", w.file("in/empty.jsonl", "")]
    )
    case("corpus-input-binary")(
        lambda w: [
            "corpus",
            "--run",
            w.tmp / "r",
            "--input",
            w.file("in/bin.jsonl", BINARY),
            "--strict",
        ]
    )
    case("corpus-input-not-json")(
        lambda w: [
            "corpus",
            "--run",
            w.tmp / "r",
            "--input",
            w.file("in/x.jsonl", "hello\n{broken\n"),
            "--strict",
        ]
    )
    case("corpus-input-wrong-field")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--input",
                   w.file("in/x.jsonl", json.dumps({"body": "가나다"}) + "\n"), "--strict"]
    )  # fmt: skip
    case("corpus-input-unsupported-type")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--input", w.file("in/x.docx", "PK")]
    )
    case("corpus-truncated-zst-alone")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--input", truncated_zst(w)]
    )
    case("corpus-truncated-zst-strict")(
        lambda w: [
            "corpus",
            "--run",
            w.tmp / "r",
            "--strict",
            "--input",
            str(truncated_zst(w, "in/a.jsonl.zst").parent / "*"),
        ]
    )
    case("corpus-truncated-gz-strict")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--strict", "--input", truncated_gz(w)]
    )
    case("corpus-input-is-folder-of-nothing")(
        lambda w: ["corpus", "--run", w.tmp / "r", "--input", w.folder("empty-dir")]
    )
    case("corpus-bad-min-chars")(lambda w: ["corpus", "--run", w.tmp / "r", "--min-chars", "-5"])

    # --- later stages on a run that lacks what they need ---
    case("tokenizer-without-corpus")(lambda w: ["tokenizer", "--run", w.folder("r")])
    case("shards-without-tokenizer")(
        lambda w: ["shards", "--run", w.run_copy("tokenizer", "shards")]
    )
    case("pretrain-without-shards")(lambda w: ["pretrain", "--run", w.run_copy("shards")])
    case("pretrain-unknown-preset")(
        lambda w: ["pretrain", "--run", w.run_copy(), "--preset", "giant-99b"]
    )
    case("pretrain-fp4")(lambda w: ["pretrain", "--run", w.run_copy(), "--precision", "fp4"])
    case("export-without-pretrain")(lambda w: ["export", "--run", w.run_copy()])
    case("export-unknown-checkpoint")(
        lambda w: ["export", "--run", w.trained_copy(), "--checkpoint", "999"]
    )
    case("export-uncommitted-truncated-distcp")(
        lambda w: ["export", "--run", w.uncommitted_checkpoint(), "--checkpoint", "4"]
    )
    case("export-checkpoint-path-is-file")(
        lambda w: ["export", "--run", w.trained_copy(), "--checkpoint", w.file("ck.pt", BINARY)]
    )
    case("sft-without-pretrain")(lambda w: ["sft", "--run", w.run_copy()])
    sft_data = {
        "sft-data-missing": lambda w: w.tmp / "none.jsonl",
        "sft-data-binary": lambda w: w.file("chat.jsonl", BINARY),
    }
    for name, data in sft_data.items():
        case(name)(
            lambda w, d=data: ["sft", "--run", w.run_copy(), "--model", w.model_dir, "--data", d(w)]
        )

    # --- output paths that hold the user's files ---
    case("export-out-is-user-file")(
        lambda w: ["export", "--run", w.trained_copy(), "--out", w.file("thesis.txt", "mine\n")]
    )
    case("export-out-user-folder")(
        lambda w: ["export", "--run", w.trained_copy(), "--out", w.folder("mine", a="keep")]
    )
    case("export-out-user-folder-force")(
        lambda w: [
            "export",
            "--run",
            w.trained_copy(),
            "--out",
            w.folder("mine", a="keep"),
            "--force",
        ]
    )
    case("eval-out-user-folder")(
        lambda w: ["eval", "--model", w.model_dir, "--task", "demo_qa=" + str(w.demo_run / "demo" / "benchmark.jsonl"),
                   "--out", w.folder("results", **{"notes.md": "mine"})]
    )  # fmt: skip
    case("eval-out-is-user-file")(
        lambda w: ["eval", "--model", w.model_dir, "--task", "demo_qa=" + str(w.demo_run / "demo" / "benchmark.jsonl"),
                   "--out", w.file("results.md", "mine")]
    )  # fmt: skip
    case("decontam-out-is-user-file")(
        lambda w: ["decontam", "--corpus", w.file("t.jsonl", '{"text": "가나다"}\n'),
                   "--benchmark", "kobest_boolq=" + str(w.file("b.jsonl", '{"paragraph": "가", "question": "나", "label": 1}\n')),
                   "--out", w.file("out.txt", "mine")]
    )  # fmt: skip
    case("demo-out-is-user-file")(lambda w: ["demo", "--out", w.file("d.txt", "mine")])
    # (the demo world's files go next to a user's other files; one of the same name is theirs)
    case("demo-out-user-file-of-same-name-force")(
        lambda w: ["demo", "--out", w.folder("d", **{"benchmark.jsonl": "my own\n"}), "--force"]
    )
    case("generate-out-is-user-file")(
        lambda w: ["generate", w.model_dir, "--prompt", "안녕", "--max-new-tokens", "2",
                   "--out", w.file("answers.jsonl", "mine\n")]
    )  # fmt: skip

    # --- model folders: generate, eval, doctor, chat ---
    for damage in MODEL_DAMAGE:
        case(f"generate-{damage}")(
            lambda w, d=damage: [
                "generate",
                w.model_copy(MODEL_DAMAGE[d]),
                "--prompt",
                "안녕",
                "--max-new-tokens",
                "2",
            ]
        )
    for damage in ("truncated-weights", "garbled-header", "pickle-weights", "no-weights",
                   "garbled-config"):  # fmt: skip
        case(f"eval-{damage}")(
            lambda w, d=damage: ["eval", "--model", w.model_copy(MODEL_DAMAGE[d]), "--task",
                                 "demo_qa=" + str(w.demo_run / "demo" / "benchmark.jsonl"), "--limit", "2"]
        )  # fmt: skip
    for damage in ("truncated-weights", "garbled-header", "pickle-weights", "no-weights"):
        case(f"doctor-{damage}")(lambda w, d=damage: ["doctor", w.model_copy(MODEL_DAMAGE[d])])
    case("chat-truncated-weights")(
        lambda w: ["chat", w.model_copy(MODEL_DAMAGE["truncated-weights"])]
    )
    case("generate-model-missing")(lambda w: ["generate", w.tmp / "nope", "--prompt", "안녕"])
    case("generate-model-is-file")(
        lambda w: ["generate", w.file("m.bin", BINARY), "--prompt", "안녕"]
    )
    case("doctor-model-missing")(lambda w: ["doctor", w.tmp / "nope"])
    case("eval-model-missing")(
        lambda w: ["eval", "--model", w.tmp / "nope", "--task", "kobest_boolq"]
    )
    case("generate-prompts-missing")(
        lambda w: ["generate", w.model_dir, "--prompts", w.tmp / "p.txt"]
    )
    case("generate-prompts-binary")(
        lambda w: ["generate", w.model_dir, "--prompts", w.file("p.txt", b"\xff\xfe" + BINARY)]
    )
    case("generate-prompts-bad-jsonl")(
        lambda w: ["generate", w.model_dir, "--prompts", w.file("p.jsonl", '{"prompt": 3}\n')]
    )
    case("generate-prompts-empty")(
        lambda w: ["generate", w.model_dir, "--prompts", w.file("p.txt", "")]
    )
    case("generate-prompt-and-prompts")(
        lambda w: ["generate", w.model_dir, "--prompt", "a", "--prompts", w.file("p.txt", "b\n")]
    )

    # --- eval tasks and benchmark files ---
    case("eval-unknown-task")(lambda w: ["eval", "--model", w.model_dir, "--task", "kobest_nope"])
    case("eval-task-file-missing")(
        lambda w: [
            "eval",
            "--model",
            w.model_dir,
            "--task",
            "kobest_boolq=" + str(w.tmp / "none.tsv"),
        ]
    )
    case("eval-task-file-binary")(
        lambda w: [
            "eval",
            "--model",
            w.model_dir,
            "--task",
            "kobest_boolq=" + str(w.file("b.jsonl", BINARY)),
        ]
    )
    case("eval-task-tsv-bad-columns")(
        lambda w: ["eval", "--model", w.model_dir, "--task",
                   "kobest_copa=" + str(w.file("c.tsv", "ID\tsentence\tAnswer\n1\t비\t1\n"))]
    )  # fmt: skip
    case("eval-contamination-missing")(
        lambda w: ["eval", "--model", w.model_dir, "--task", "demo_qa=" + str(w.demo_run / "demo" / "benchmark.jsonl"),
                   "--contamination", w.tmp / "items.jsonl"]
    )  # fmt: skip
    case("eval-contamination-bad-line")(
        lambda w: ["eval", "--model", w.model_dir, "--task", "demo_qa=" + str(w.demo_run / "demo" / "benchmark.jsonl"),
                   "--contamination", w.file("items.jsonl", '{"benchmark": "demo_qa"}\n')]
    )  # fmt: skip
    case("eval-bad-dtype")(
        lambda w: ["eval", "--model", w.model_dir, "--task", "kobest_boolq", "--dtype", "fp64"]
    )

    # --- decontam ---
    case("decontam-corpus-no-match")(
        lambda w: ["decontam", "--corpus", str(w.tmp / "none" / "*.jsonl"), "--out", w.tmp / "o",
                   "--benchmark", "jsonl=" + str(w.file("b.jsonl", '{"text": "가나다"}\n'))]
    )  # fmt: skip
    case("decontam-corpus-unsupported")(
        lambda w: ["decontam", "--corpus", w.file("t.parquet", BINARY), "--out", w.tmp / "o",
                   "--benchmark", "jsonl=" + str(w.file("b.jsonl", '{"text": "가나다"}\n'))]
    )  # fmt: skip
    case("decontam-benchmark-bad-spec")(
        lambda w: ["decontam", "--corpus", w.file("t.jsonl", '{"text": "가"}\n'), "--out", w.tmp / "o",
                   "--benchmark", "boolq"]
    )  # fmt: skip
    case("decontam-benchmark-missing")(
        lambda w: ["decontam", "--corpus", w.file("t.jsonl", '{"text": "가"}\n'), "--out", w.tmp / "o",
                   "--benchmark", "kobest_boolq=" + str(w.tmp / "none.tsv")]
    )  # fmt: skip
    case("decontam-benchmark-binary")(
        lambda w: ["decontam", "--corpus", w.file("t.jsonl", '{"text": "가"}\n'), "--out", w.tmp / "o",
                   "--benchmark", "kobest_boolq=" + str(w.file("b.tsv", BINARY))]
    )  # fmt: skip
    case("decontam-benchmark-empty")(
        lambda w: ["decontam", "--corpus", w.file("t.jsonl", '{"text": "가"}\n'), "--out", w.tmp / "o",
                   "--benchmark", "jsonl=" + str(w.file("b.jsonl", ""))]
    )  # fmt: skip
    case("decontam-bad-shard")(
        lambda w: ["decontam", "--corpus", w.file("t.jsonl", '{"text": "가"}\n'), "--out", w.tmp / "o",
                   "--benchmark", "jsonl=" + str(w.file("b.jsonl", '{"text": "가나다"}\n')), "--shard", "3/2"]
    )  # fmt: skip
    case("decontam-merge-nothing")(lambda w: ["decontam", "merge", "--out", w.folder("o")])
    case("decontam-run-without-corpus")(
        lambda w: [
            "decontam",
            "--run",
            w.folder("r"),
            "--set",
            "decontam.benchmarks=['demo_qa=demo']",
        ]
    )

    # --- plan, demo, preflight ---
    case("plan-unknown-gpu")(lambda w: ["plan", "--preset", "1.3b", "--gpu", "gtx-9999"])
    case("plan-negative-gpus")(
        lambda w: ["plan", "--preset", "1.3b", "--gpu", "rtx5090", "--gpus", "-1"]
    )
    case("plan-unknown-preset")(lambda w: ["plan", "--preset", "nope"])
    case("demo-zero-size")(lambda w: ["demo", "--out", w.tmp / "d", "--size-mb", "0"])
    case("preflight-run-is-a-file")(lambda w: ["preflight", "--run", w.file("p.txt", "mine")])
    return cases


CASES = _cases()
# Messages whose "what" is its own fix (a usage mistake stated with the right usage).
WITHOUT_FIX = {"generate-prompt-and-prompts"}


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_table_covers_every_command():
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)
    names = " ".join(c.name for c in CASES)
    for command in ("corpus", "tokenizer", "shards", "pretrain", "export", "sft", "eval",
                    "decontam", "generate", "chat", "doctor", "plan", "demo", "preflight", "run"):  # fmt: skip
        assert command in names, command


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_input_is_one_clear_error_and_costs_nothing(
    case, tmp_path, cli, demo_run, model_dir, trained_run
):
    world = World(tmp_path, demo_run, model_dir, trained_run)
    argv = case.argv(world)
    before = _snapshot(tmp_path)
    result = cli(*argv)
    output = result.out + result.err
    assert result.code == 2, (case.name, result.code, output[-2000:])
    assert "Traceback" not in output, output[-2000:]
    assert "Fix:" in result.err or case.name in WITHOUT_FIX, result.err
    after = _snapshot(tmp_path)
    for name, digest in before.items():
        assert after.get(name) == digest, f"{case.name}: {name} was changed or deleted"
    new_markers = [n for n in after if n not in before and Path(n).name == "stage.json"]
    assert not new_markers, f"{case.name}: stages marked complete: {new_markers}"


def test_the_intact_model_folder_works(model_dir, cli):
    """The damaged copies fail because of the damage: the intact folder generates."""
    result = cli("generate", model_dir, "--prompt", "안녕", "--max-new-tokens", "2", "--greedy")
    assert result.code == 0, result.err


# ---------------------------------------------------------------------------------------------
# Property-based: random bytes and random TOML


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

READERS = ("kobest_boolq", "kobest_copa", "kobest_hellaswag", "kobest_sentineg", "kobest_wic",
           "gsm8k_ko", "ifeval_ko", "demo_qa", "jsonl")  # fmt: skip
SUFFIXES = (".tsv", ".jsonl", ".json", ".csv", ".parquet", ".jsonl.gz", ".jsonl.zst")


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        st.binary(max_size=400),
        st.text(max_size=300).map(str.encode),
        st.lists(
            st.dictionaries(
                st.sampled_from(["paragraph", "question", "label", "text", "ID", "Text", "Answer",
                                 "premise", "alternative_1", "alternative_2", "context", "sentence",
                                 "word", "context_1", "context_2", "ending_1", "prompt", "answer"]),
                st.one_of(st.text(max_size=20), st.integers(-3, 5), st.booleans(), st.none()),
                max_size=8,
            ),
            max_size=4,
        ).map(lambda rows: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()),
        st.lists(st.lists(st.text(alphabet="가나ab1\t \"'", max_size=8), min_size=1, max_size=6),
                 max_size=5).map(lambda rows: "\n".join("\t".join(r) for r in rows).encode()),
    ),
    benchmark=st.sampled_from(READERS),
    suffix=st.sampled_from(SUFFIXES),
)  # fmt: skip
def test_readers_give_items_or_a_user_error(tmp_path, data, benchmark, suffix):
    from hanlm.testsets import readers

    path = tmp_path / f"bench{suffix}"
    if suffix.endswith(".gz"):
        data = gzip.compress(data)
    elif suffix.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    try:
        items = readers.read(benchmark, path)
    except UserError:
        return
    assert items and all(isinstance(i.overlap_text, str) for i in items)


TOML_KEYS = ("corpus.min_chars", "corpus.near_dedup", "tokenizer.vocab_size", "model.preset",
             "optimizer.lr", "precision.mode", "decontam.ngram", "decontam.benchmarks",
             "eval.tasks", "sft.init", "bogus.key", "pretrain.bogus")  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.dictionaries(
            st.sampled_from(TOML_KEYS),
            st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=True), st.booleans(),
                      st.text(max_size=12), st.lists(st.text(max_size=6), max_size=3)),
            max_size=5,
        ).map(lambda d: "".join(
            f"[{k.split('.')[0]}]\n{k.split('.')[1]} = {json.dumps(v, ensure_ascii=False)}\n"
            for k, v in d.items())),
    )
)  # fmt: skip
def test_config_loader_gives_a_config_or_a_user_error(tmp_path, text):
    from hanlm.config import Config, load_config

    path = tmp_path / "recipe.toml"
    path.write_text(text, encoding="utf-8")
    try:
        cfg = load_config(path)
    except UserError:
        return
    assert isinstance(cfg, Config)
