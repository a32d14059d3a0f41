"""Export: a checkpoint becomes a plain Hugging Face folder that transformers loads as it is."""

import json
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from conftest import TINY_PRETRAIN, assert_user_error
from hanlm.data.shards import ShardsManifest
from hanlm.errors import UserError
from hanlm.model import build_model, model_config
from hanlm.pipeline import run_stage
from hanlm.stages import export as export_stage
from hanlm.stages import run_facts
from hanlm.stages.rundir import load_run_config
from hanlm.train import export
from hanlm.train.checkpoint_layout import step_dir
from hanlm.train.optim import adamw
from user_files import snapshot, user_file, user_folder

# Checkpoints at steps 4 and 8; little logging.
TINY = {
    **TINY_PRETRAIN,
    "logging.log_every": 4,
    "logging.eval_every": 8,
    "logging.eval_batches": 1,
}


def config_for(run_dir, **extra):
    return load_run_config(run_dir, values={**TINY, **extra})


@pytest.fixture(scope="module")
def trained_run(demo_run, tmp_path_factory):
    """The demo run trained for 8 tiny steps (checkpoints at 4 and 8); tests copy it."""
    run_dir = tmp_path_factory.mktemp("export") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    run_stage("pretrain", config_for(run_dir), run_dir)
    return run_dir


@pytest.fixture
def run_dir(trained_run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(trained_run, target)
    return target


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    """The default export of `trained_run` (its latest checkpoint), made once."""
    out = tmp_path_factory.mktemp("hf") / "hf"
    made = export_stage.export_chosen(
        config_for(trained_run), trained_run, checkpoint=None, out=out, force=False
    )
    return out, made


def tiny_config(run_dir, preset="tiny"):
    vocab = ShardsManifest.read(run_dir / "shards" / ShardsManifest.FILE).vocab_size
    return model_config(preset, vocab_size=vocab, seq_len=TINY["pretrain.seq_len"])


def trained_model(run_dir, step: int):
    """The checkpoint's model read the way training resumes it (model and optimizer state
    together, in place), independent of export's own loader."""
    model = build_model(tiny_config(run_dir))
    optimizer = adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device="cpu")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP "assumes" a single process: we mean it
        dcp.load(state, checkpoint_id=str(step_dir(run_dir / "pretrain" / "checkpoints", step)))
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=state["optim"])
    return model


def batch(run_dir) -> torch.Tensor:
    tok = run_facts.tokenizer(run_dir)
    texts = ["서울은 대한민국의 수도이다.", "한국어 모델을 처음부터 학습한다."]
    rows = [tok.encode(t).ids[:12] for t in texts]
    width = min(len(r) for r in rows)
    return torch.tensor([r[:width] for r in rows])


@torch.no_grad()
def logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model.eval()(input_ids=ids).logits.float()


def test_round_trip_logits_match_the_checkpoint(trained_run, exported):
    out, made = exported
    assert made.record.step == 8 and not made.skipped
    ids = batch(trained_run)
    loaded = export.load_exported(out)
    expected = logits(trained_model(trained_run, 8), ids)
    torch.testing.assert_close(logits(loaded, ids), expected, atol=1e-5, rtol=0)
    # the comparison means something: the untrained model and the step-4 weights differ
    untrained = logits(build_model(tiny_config(trained_run)), ids)
    assert (untrained - expected).abs().max() > 1e-2
    assert (logits(trained_model(trained_run, 4), ids) - expected).abs().max() > 1e-3
    # and the ties survived: one embedding matrix, read back as one
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_folder_has_weights_config_generation_and_tokenizer(trained_run, exported):
    from transformers import AutoTokenizer

    out, made = exported
    names = {p.name for p in out.iterdir()}
    expected = {"model.safetensors", "config.json", "generation_config.json", export.RECORD}
    assert expected | set(export.TOKENIZER_FILES) <= names
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)  # no pickles
    special = json.loads((trained_run / "tokenizer" / "special_tokens.json").read_text())
    bos, eod, pad = (special[k]["id"] for k in ("bos", "eod", "pad"))
    generation = json.loads((out / "generation_config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    for ids in (generation, config):
        assert (ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]) == (bos, eod, pad)
    assert pad != eod
    assert config["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (bos, eod, pad)
    assert tok.model_max_length == TINY["pretrain.seq_len"]
    chat = tok.apply_chat_template([{"role": "user", "content": "안녕"}], tokenize=False)
    assert chat == "<|user|>\n안녕<|eot|>\n"
    record = export.ExportRecord.read(out / export.RECORD)
    assert record.step == 8 and record.tokens == 8 * 512
    assert record.source_checkpoint.endswith("step-00000008")
    assert record == made.record and len(record.model_sha256) == 64


def chosen(cfg, run_dir, checkpoint, out=None, force=False):
    return export_stage.export_chosen(cfg, run_dir, checkpoint=checkpoint, out=out, force=force)


def test_chosen_step_and_skip_on_rerun(run_dir):
    cfg = config_for(run_dir)
    first = chosen(cfg, run_dir, "4")
    out = run_dir / "pretrain" / "hf-step-00000004"  # beside the stage's own pretrain/hf
    assert first.record.step == 4 and not first.skipped
    record = (out / export.RECORD).read_text()
    again = chosen(cfg, run_dir, "4")
    assert again.skipped and again.record == first.record
    assert (out / export.RECORD).read_text() == record
    latest = run_stage("export", cfg, run_dir)  # the stage: the latest checkpoint
    assert isinstance(latest, export.ExportRecord)
    assert latest.step == 8 and latest.model_sha256 != first.record.model_sha256
    marker = (run_dir / "pretrain" / "hf" / "stage.json").read_text()
    assert run_stage("export", cfg, run_dir) == latest  # up to date: skipped
    assert (run_dir / "pretrain" / "hf" / "stage.json").read_text() == marker
    forced = run_stage("export", cfg, run_dir, force=True)
    assert forced.model_sha256 == latest.model_sha256 and forced != latest  # a new export
    by_path = chosen(cfg, run_dir, str(run_dir / "pretrain/checkpoints/step-00000004"))
    assert by_path.record.step == 4


def test_chat_end_tokens_and_bf16(trained_run, tmp_path):
    special = json.loads((trained_run / "tokenizer" / "special_tokens.json").read_text())
    eod, eot = special["eod"]["id"], special["eot"]["id"]
    out = export.export_checkpoint(
        trained_run / "pretrain" / "checkpoints" / "step-00000008",
        tmp_path / "hf",
        model_config=tiny_config(trained_run),
        tokenizer_dir=trained_run / "tokenizer",
        eos_token_ids=[eot, eod],
        dtype=torch.bfloat16,
    )
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [eot, eod]
    assert export.load_exported(out).dtype == torch.bfloat16


def save_model_checkpoint(path, state: dict) -> None:
    """A checkpoint folder in the trainer's layout holding just `state` as its model."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP "assumes" a single process: we mean it
        dcp.save({"model": state}, checkpoint_id=str(path))
    (path / "trainer.json").write_text(json.dumps({"step": 1, "tokens": 0}))


def test_tied_and_untied_weights(trained_run, tmp_path):
    tied = tiny_config(trained_run)
    untied = tiny_config(trained_run)
    untied.tie_word_embeddings = False
    model = build_model(untied, seed=1)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    save_model_checkpoint(tmp_path / "untied", model.state_dict())
    common = {"tokenizer_dir": trained_run / "tokenizer"}
    out = export.export_checkpoint(
        tmp_path / "untied", tmp_path / "hf", model_config=untied, **common
    )
    ids = batch(trained_run)
    loaded = export.load_exported(out)
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=1e-5, rtol=0)
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    # two different matrices cannot become one tied matrix without a word
    with pytest.raises(UserError, match=r"differs from model\.embed_tokens\.weight"):
        export.export_checkpoint(tmp_path / "untied", tmp_path / "x", model_config=tied, **common)
    # a checkpoint that stores the tied matrix under one name only is complete
    only_embedding = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_model_checkpoint(tmp_path / "one_name", only_embedding)
    out = export.export_checkpoint(
        tmp_path / "one_name", tmp_path / "hf", model_config=tied, **common
    )
    loaded = export.load_exported(out)
    torch.testing.assert_close(loaded.lm_head.weight, model.model.embed_tokens.weight)
    # but the untied model needs both
    with pytest.raises(UserError, match=r"has no tensor lm_head\.weight"):
        export.export_checkpoint(
            tmp_path / "one_name", tmp_path / "x", model_config=untied, **common
        )
    assert not (tmp_path / "x").exists()


def test_user_errors(run_dir, tmp_path):
    cfg = config_for(run_dir)
    with pytest.raises(UserError, match="no committed checkpoint for step 5") as err:
        chosen(cfg, run_dir, "5")
    assert "4, 8" in str(err.value)
    with pytest.raises(UserError, match="neither a step number nor a folder"):
        chosen(cfg, run_dir, "nowhere")
    with pytest.raises(UserError, match=r"embed_tokens\.weight has shape \[1024, 64\]"):
        run_stage("export", config_for(run_dir, **{"model.preset": "demo"}), run_dir)
    special = json.loads((run_dir / "tokenizer" / "special_tokens.json").read_text())
    with pytest.raises(UserError, match="padding token"):
        export.export_checkpoint(
            run_dir / "pretrain" / "checkpoints" / "step-00000004",
            tmp_path / "pad",
            model_config=tiny_config(run_dir),
            tokenizer_dir=run_dir / "tokenizer",
            eos_token_ids=[special["pad"]["id"]],
        )
    assert not (tmp_path / "pad").exists()

    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(run_dir, no_tokenizer)
    shutil.rmtree(no_tokenizer / "tokenizer")
    with pytest.raises(UserError, match="no finished tokenizer"):
        run_stage("export", cfg, no_tokenizer)
    with pytest.raises(UserError, match=r"lacks tokenizer\.json"):
        export.export_checkpoint(
            run_dir / "pretrain" / "checkpoints" / "step-00000004",
            tmp_path / "hf",
            model_config=tiny_config(run_dir),
            tokenizer_dir=no_tokenizer / "tokenizer",
        )

    shutil.rmtree(run_dir / "pretrain")
    with pytest.raises(UserError, match="run `hanlm pretrain"):
        run_stage("export", cfg, run_dir)
    assert not (run_dir / "pretrain" / "hf").exists()


def test_a_step_named_explicitly_is_checked_like_the_latest(run_dir, cli):
    step4 = run_dir / "pretrain" / "checkpoints" / "step-00000004"
    [shard] = step4.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 10])
    cfg = config_for(run_dir)
    with pytest.raises(UserError, match=r"is damaged: __0_0\.distcp has"):
        chosen(cfg, run_dir, "4")  # committed: its manifest catches it
    (step4 / "manifest.json").unlink()  # uncommitted: nothing vouches for its files
    settings = [a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    result = cli("export", "--run", run_dir, "--checkpoint", "4", *settings)
    assert result.code == 2 and "Traceback" not in result.err, result.err
    assert "is not committed" in result.err and "committed: 8" in result.err
    assert not list((run_dir / "pretrain").glob("hf*"))
    # a caller that reads such a folder anyway gets a UserError, not torch's traceback
    with pytest.raises(UserError, match="checkpoint's files, they are damaged"):
        export.load_checkpoint_model(step4, tiny_config(run_dir))


# (A checkpoint written by 2 FSDP2 ranks, each its shards, is exported in
# tests/integration/test_pretrain.py, where they train it.)


# --- the output folder: nothing a user has is lost ------------------------------------------


def export_cli(cli, run_dir, *args):
    settings = [a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    return cli("export", "--run", run_dir, *settings, *args)


def test_out_that_is_a_file_or_a_users_folder_is_refused(run_dir, tmp_path, cli):
    file = user_file(tmp_path / "model.safetensors")
    folder = user_folder(tmp_path / "mine")
    (folder / "config.json").write_text('{"mine": true}')  # even with an export's file names
    before = snapshot(tmp_path)
    assert_user_error(export_cli(cli, run_dir, "--out", file), "is a file, not a folder")
    assert_user_error(export_cli(cli, run_dir, "--out", file / "hf"), "cannot be created")
    for force in ([], ["--force"]):
        result = export_cli(cli, run_dir, "--out", folder, *force)
        assert_user_error(result, "hanlm did not write (README.md, config.json, notes)")
    assert snapshot(tmp_path) == before


def test_out_holding_an_earlier_export_is_replaced_only_with_force(run_dir, tmp_path, cli):
    out = tmp_path / "hf"
    out.mkdir()  # an empty folder is fine
    assert export_cli(cli, run_dir, "--out", out, "--checkpoint", "4").code == 0
    assert export_cli(cli, run_dir, "--out", out, "--checkpoint", "4").code == 0  # same: skipped
    before = snapshot(out)
    assert_user_error(export_cli(cli, run_dir, "--out", out), "earlier hanlm output", "--force")
    assert snapshot(out) == before
    assert export_cli(cli, run_dir, "--out", out, "--force").code == 0
    assert export.ExportRecord.read(out / export.RECORD).step == 8
    # a model card the user added is not the export's to delete, --force or not
    (out / "README.md").write_text("# my model\n")
    before = snapshot(out)
    result = export_cli(cli, run_dir, "--out", out, "--checkpoint", "4", "--force")
    assert_user_error(result, "files hanlm did not write there (README.md)")
    assert snapshot(out) == before


def test_the_runs_own_export_folder_is_updated_without_force(run_dir, cli):
    assert export_cli(cli, run_dir, "--checkpoint", "4").code == 0
    assert export_cli(cli, run_dir).code == 0
    assert export.ExportRecord.read(run_dir / "pretrain" / "hf" / export.RECORD).step == 8


def test_a_checkpoint_without_its_manifest_is_named_as_uncommitted(run_dir, cli):
    for step in (4, 8):
        (step_dir(run_dir / "pretrain" / "checkpoints", step) / "manifest.json").unlink()
    result = export_cli(cli, run_dir)
    assert_user_error(
        result,
        "no committed checkpoint",
        "step-00000004, step-00000008 have no manifest.json",
        "--force",  # pretraining is marked finished: only --force trains again
    )
    assert "no checkpoint to export" not in result.err  # the old message: "run pretrain first"


def test_a_damaged_export_is_made_again_on_skip_and_refused_by_generate(run_dir, cli):
    """Same-size damage to the weights: `generate` refuses the folder naming its checksum,
    and the export stage, finding it up to date otherwise, exports it again."""
    cfg = config_for(run_dir)
    run_stage("export", cfg, run_dir)
    weights = run_dir / "pretrain" / "hf" / export.WEIGHTS
    good = weights.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) - 10] ^= 0x01  # in the tensor data, not the header
    weights.write_bytes(bytes(damaged))
    result = cli("generate", run_dir / "pretrain" / "hf", "--prompt", "안녕")
    assert_user_error(result, "damaged", "fails its sha256", "hanlm export")
    record = run_stage("export", cfg, run_dir)
    assert weights.read_bytes() == good and record.model_sha256 == export.file_sha256(weights)
