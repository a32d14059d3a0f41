"""`hanlm sft` on the demo world: the tiny model, pretrained without any chat token, learns to
end its answers once the untrained template tokens are initialised; the field's setup (LoRA, the
rows frozen and not initialised) is measured beside it, and LoRA's own checks."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import TINY_PRETRAIN, assert_user_error, write_jsonl
from damaged_models import damaged_copy
from hanlm.config import LORA_TARGETS_DEFAULT
from hanlm.data import chat_data
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages.rundir import load_run_config
from hanlm.train import export, precision, sft, sft_data
from hanlm.train.results import SftSummary

TINY_SFT = {
    "sft.seq_len": 256,
    "sft.micro_batch": 8,
    "sft.batch_rows": 8,
    "sft.max_steps": 60,
    "sft.new_token_lr_scale": 3.0,  # the initialised rows move faster: they start identical
    "sft.optimizer.lr": 1e-2,
    "sft.optimizer.warmup_steps": 4,
    # the schedule these tests were written for, whatever the demo recipe's [sft.optimizer] says
    "sft.optimizer.schedule": "cosine",
    "sft.optimizer.min_lr_ratio": 0.1,
    "sft.optimizer.decay_fraction": 0.2,
    "sft.heldout": 30,
    "sft.closure_max_tokens": 64,
    "sft.checkpoint.every": 30,
    "sft.logging.log_every": 20,
}


# the field's setup as a compared variant: LoRA, the template rows frozen and not initialised
FIELD_SETUP = [{"method": "lora", "init": "none", "train_new_token_rows": False}]


def plain_chats(run_dir, path):
    """The demo world's conversations without the arithmetic ones: a 0.2M-parameter model
    trained for seconds cannot do sums, and loops on digits instead of answering."""
    rows = [
        c
        for c in chat_data.read_conversations(run_dir / "demo" / "chat.jsonl")
        if not any("####" in m["content"] for m in c["messages"])
    ]
    return write_jsonl(path, rows)


def config(run_dir, **extra):
    return load_run_config(run_dir, values={**TINY_PRETRAIN, **TINY_SFT, **extra})


@pytest.fixture(scope="module")
def pretrained(demo_run, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain", "sft"))
    cfg = load_run_config(run_dir, values=TINY_PRETRAIN)
    run_stage("pretrain", cfg, run_dir)
    run_stage("export", cfg, run_dir)
    plain_chats(run_dir, run_dir / "chat_plain.jsonl")
    return run_dir


def copy_of(pretrained, folder):
    """A run of its own with `pretrained`'s pretraining, for an SFT beside the shared one."""
    shutil.copytree(pretrained, folder, ignore=shutil.ignore_patterns("sft"))
    return folder


@pytest.fixture(scope="module")
def sft_run(pretrained):
    cfg = config(
        pretrained,
        **{"sft.data": str(pretrained / "chat_plain.jsonl"), "sft.compare": FIELD_SETUP},
    )
    summary = run_stage("sft", cfg, pretrained)
    return pretrained, summary


def test_mean_init_closes_answers_and_none_is_measured(sft_run):
    run_dir, summary = sft_run
    out = run_dir / "sft"
    closure = json.loads((out / "closure.json").read_text())
    by_variant = json.loads((out / "summary.json").read_text())["closure_by_variant"]
    ablation = json.loads((out / "ablation" / "lora-none-frozen" / "closure.json").read_text())
    print(f"closure: {by_variant}")
    assert closure["init"] == "mean" and closure["total"] >= 20
    assert closure["variant"] == "full-mean" and closure["method"] == "full"
    assert closure["rate"] >= 0.9, closure["examples"]
    assert closure["closed"] == round(closure["rate"] * closure["total"])
    low, high = closure["interval"]
    assert 0 <= low <= closure["rate"] <= high <= 1
    assert ablation["init"] == "none" and ablation["rows_trained"] is False
    assert set(by_variant) == {"full-mean", "lora-none-frozen"}
    frozen = [ablation["diagnosis"][when]["row_norms"]["embedding"]["template"]["eot"]
              for when in ("before", "after")]  # fmt: skip
    assert frozen[0] == frozen[1]  # LoRA with the rows frozen: <|eot|>'s row never moved
    assert {"answer", "prompt", "closed", "reference"} <= set(closure["examples"][0])
    assert summary.closure is not None and summary.closure.rate == closure["rate"]
    # why: <|eot|>'s rank where the held-out answers end, and the rows' norms, before and after
    for check in (closure, ablation):
        for when in ("before", "after"):
            rank = check["diagnosis"][when]["eot_rank"]
            assert rank["answers"] >= closure["total"] and 0 <= rank["top1"] <= 1
            norms = check["diagnosis"][when]["row_norms"]["embedding"]
            assert set(norms["template"]) == {"system", "user", "assistant", "eot"}
    mean_before = closure["diagnosis"]["before"]["row_norms"]["embedding"]
    none_before = ablation["diagnosis"]["before"]["row_norms"]["embedding"]
    assert mean_before["ordinary_mean"] == none_before["ordinary_mean"]  # the same source model
    assert mean_before["template"]["eot"] < mean_before["ordinary_mean"]  # a mean of rows is short
    # SFT taught the initialised model to end: <|eot|> ranks first at most answer ends
    assert closure["diagnosis"]["after"]["eot_rank"]["top1"] >= 0.8
    assert closure["diagnosis"]["before"]["eot_rank"]["median_rank"] > 0


def test_audit_finds_the_chat_tokens_untrained(sft_run):
    run_dir, summary = sft_run
    audit = json.loads((run_dir / "sft" / "audit.json").read_text())
    assert audit["tied"] is True and audit["counts_source"] == "shard manifest"
    assert audit["untrained_template_tokens"] == ["system", "user", "assistant", "eot"]
    by_name = {t["name"]: t for t in audit["tokens"]}
    assert by_name["eot"]["pretrain_count"] == 0 and by_name["eot"]["verdict"] == "untrained"
    assert by_name["eod"]["pretrain_count"] > 0 and by_name["eod"]["verdict"] == "trained"
    assert summary.untrained_template_tokens == audit["untrained_template_tokens"]


def test_export_stops_on_end_of_turn(sft_run):
    run_dir, _ = sft_run
    hf = run_dir / "sft" / "hf"
    special = json.loads((run_dir / "tokenizer" / "special_tokens.json").read_text())
    generation = json.loads((hf / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert special["eot"]["id"] in eos and special["eod"]["id"] in eos
    assert generation["pad_token_id"] == special["pad"]["id"] not in eos
    assert export.load_exported(hf) is not None
    assert (run_dir / "sft" / "stage.json").is_file()
    assert (run_dir / "sft" / "metrics.jsonl").is_file()


def test_finished_stage_is_skipped_and_gate_fails(sft_run, tmp_path):
    run_dir, summary = sft_run
    data = {"sft.data": str(run_dir / "chat_plain.jsonl"), "sft.compare": FIELD_SETUP}
    again = run_stage("sft", config(run_dir, **data), run_dir)
    assert again == summary
    # the gate: an unreachable threshold fails the stage with the numbers and a fix
    gate_run = copy_of(run_dir, tmp_path / "gate")
    out = gate_run / "sft"
    gated = config(run_dir, **{**data, "sft.compare": [], "sft.max_steps": 2,
                               "sft.min_closure": 1.0, "sft.closure_max_tokens": 4})  # fmt: skip
    with pytest.raises(UserError, match="closure") as info:
        run_stage("sft", gated, gate_run)
    assert "--init mean" in info.value.fix
    assert (out / "closure.json").is_file() and not (out / "stage.json").is_file()


def test_resume_continues_from_the_sft_checkpoint(pretrained, tmp_path):
    """A longer run of the same SFT continues from the finished shorter one's checkpoint."""
    run_dir = copy_of(pretrained, tmp_path / "run")
    out = run_dir / "sft"
    quick = {
        "sft.data": str(pretrained / "chat_plain.jsonl"),
        "sft.heldout": 4,
        "sft.closure_max_tokens": 4,
        "sft.logging.log_every": 5,
        "sft.checkpoint.every": 5,
    }
    run_stage("sft", config(run_dir, **{**quick, "sft.max_steps": 5}), run_dir)
    run_stage("sft", config(run_dir, **{**quick, "sft.max_steps": 10}), run_dir)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if "loss" in json.loads(line)]
    assert steps == [5, 10]  # step 10 came after a resume at 5, not a second run from 0
    assert SftSummary.read(out / SftSummary.FILE).step == 10


def test_doctor_on_the_trained_models(sft_run, tmp_path, cli):
    """The SFT export is healthy; the pretraining export with padding = <|eot|> is not."""
    from hanlm.chat import doctor

    run_dir, _ = sft_run
    report = doctor.diagnose(run_dir / "sft" / "hf")
    assert report["healthy"], report["findings"]
    assert cli("doctor", run_dir / "sft" / "hf").code == 0
    broken = tmp_path / "broken"
    shutil.copytree(run_dir / "pretrain" / "hf", broken)
    for name in ("config.json", "generation_config.json"):
        data = json.loads((broken / name).read_text())
        data["pad_token_id"] = 6  # <|eot|>
        (broken / name).write_text(json.dumps(data))
    problems = {
        f["check"]: f["what"]
        for f in doctor.diagnose(broken)["findings"]
        if f["level"] == "problem"
    }
    assert {"padding", "generation_config", "under-trained"} <= set(problems)
    assert "<|eot|>" in problems["under-trained"]
    assert cli("doctor", broken).code == 1


TEMPLATE_TOKENS = ("system", "user", "assistant", "eot")


@pytest.fixture(scope="module")
def lora_run(pretrained, tmp_path_factory):
    """LoRA SFT with its defaults (init mean, the template rows trained), rank 8."""
    run_dir = copy_of(pretrained, tmp_path_factory.mktemp("lora") / "run")
    cfg = config(
        run_dir,
        **{
            "sft.data": str(pretrained / "chat_plain.jsonl"),
            "sft.method": "lora",
            "sft.lora.rank": 8,
            "sft.compare": [],
            "sft.max_steps": 30,
            "sft.new_token_lr_scale": 1.0,
            "sft.heldout": 8,
            "sft.closure_max_tokens": 16,
            "sft.logging.log_every": 1,
        },
    )
    summary = run_stage("sft", cfg, run_dir)
    return run_dir, summary


def test_lora_lowers_the_loss_and_trains_only_the_chat_rows(lora_run):
    """The adapters learn; of the embedding only the template tokens' rows change (every other
    row bit-identical), of the blocks only the adapted linear layers; the adapter is kept."""
    from safetensors.torch import load_file

    run_dir, summary = lora_run
    assert summary.method == "lora"
    losses = [
        json.loads(line)["loss"]
        for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line and '"val_loss"' not in line
    ]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert len(losses) == 30 and last < first - 0.2, losses  # 6.2 -> 5.9 nats when written
    special = json.loads((run_dir / "tokenizer" / "special_tokens.json").read_text())
    rows = sorted(special[name]["id"] for name in TEMPLATE_TOKENS)
    start = load_file(run_dir / "pretrain" / "hf" / "model.safetensors")
    tuned = load_file(run_dir / "sft" / "hf" / "model.safetensors")
    assert set(start) == set(tuned)  # merged: a plain model, no adapter tensors
    key = "model.embed_tokens.weight"
    others = [i for i in range(start[key].shape[0]) if i not in rows]
    assert torch.equal(tuned[key][others], start[key][others])
    assert all(not torch.equal(tuned[key][i], start[key][i]) for i in rows)
    for name, weight in start.items():
        adapted = any(f".{target}." in name for target in LORA_TARGETS_DEFAULT)
        if name != key:
            assert torch.equal(tuned[name], weight) != adapted, name
    adapter = json.loads((run_dir / "sft" / "hf" / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and sorted(adapter["trainable_token_indices"]) == rows


def test_lora_export_equals_the_adapter_model(lora_run):
    """The merged export's logits are the adapter model's (the checkpoint's, and the kept
    adapter put back on the source model with PEFT's own loader) within 1e-5."""
    from peft import PeftModel

    from hanlm.train import checkpoint_layout

    run_dir, _ = lora_run
    merged = export.load_exported(run_dir / "sft" / "hf").eval()
    special = json.loads((run_dir / "tokenizer" / "special_tokens.json").read_text())
    adapters = sft.lora.Adapters(
        load_run_config(run_dir).sft.lora.model_copy(update={"rank": 8}),
        tuple(special[name]["id"] for name in TEMPLATE_TOKENS),
    )
    latest = checkpoint_layout.latest(run_dir / "sft" / "checkpoints")
    trained = export.load_checkpoint_adapters(latest, merged.config, adapters)
    source = export.load_exported(run_dir / "pretrain" / "hf")
    reloaded = PeftModel.from_pretrained(source, run_dir / "sft" / "hf" / "adapter").eval()
    ids = torch.tensor([[special["user"]["id"], 40, 41, 42, special["eot"]["id"], 43]])
    with torch.no_grad():
        want = merged(ids).logits
        for adapter_model in (trained, reloaded):
            torch.testing.assert_close(adapter_model(ids).logits, want, rtol=0, atol=1e-5)


def test_bad_lora_settings_fail_before_any_work(pretrained, tmp_path, cli):
    """Rank 0, a target the model lacks, FP8, and the field's setup as the SFT's own model: a
    UserError naming the fix, and nothing written."""
    run_dir = copy_of(pretrained, tmp_path / "run")
    data = {"sft.data": str(pretrained / "chat_plain.jsonl"), "sft.method": "lora"}
    result = cli("sft", "--run", run_dir, "--set", "sft.lora.rank=0")
    assert_user_error(result, "sft.lora.rank")
    cases = [
        ({"sft.lora.target_modules": ["q_proj", "qkv"]}, "'qkv'", "target_modules"),
        ({"sft.lora.target_modules": ["embed_tokens"]}, "Embedding", "target_modules"),
        ({"precision.mode": "fp8-emulate"}, "FP8", "bf16"),
        ({"sft.init": "none", "sft.train_new_token_rows": False}, "never trained",
         "train_new_token_rows = true"),
    ]  # fmt: skip
    for extra, what, fix in cases:
        with pytest.raises(UserError, match=what) as info:
            run_stage("sft", config(run_dir, **data, **extra), run_dir)
        assert fix in info.value.fix
        assert not (run_dir / "sft" / "audit.json").exists()
        assert not (run_dir / "sft" / "checkpoints").exists()


def test_doctor_names_the_frozen_rows_of_a_lora_model(sft_run, tmp_path):
    """The field's setup (the compared LoRA variant, rows frozen and not initialised), exported:
    the doctor finds <|eot|> untrained and says LoRA froze it, naming the fix."""
    from hanlm.chat import doctor
    from hanlm.train import checkpoint_layout

    run_dir, _ = sft_run
    ablation = run_dir / "sft" / "ablation" / "lora-none-frozen"
    cfg = config(run_dir)
    special = json.loads((run_dir / "tokenizer" / "special_tokens.json").read_text())
    out = tmp_path / "frozen"
    export.export_checkpoint(
        checkpoint_layout.latest(ablation / "checkpoints"),
        out,
        model_config=export.load_exported(run_dir / "sft" / "hf").config,
        tokenizer_dir=run_dir / "tokenizer",
        eos_token_ids=[special["eot"]["id"], special["eod"]["id"]],
        adapters=sft.lora.Adapters(cfg.sft.lora, ()),
    )
    findings = doctor.diagnose(out)["findings"]
    lora_notes = [f for f in findings if f["check"] == "lora"]
    assert lora_notes and "<|eot|>" in lora_notes[0]["what"]
    untrained = [f for f in findings if f["check"] == "under-trained" and f["level"] == "problem"]
    assert untrained and "train_new_token_rows" in untrained[0]["fix"], findings


def test_contaminated_conversations_are_dropped_or_refused(pretrained, tmp_path):
    class Index:  # the decontam index's API: matches(text, min_coverage) -> hits
        def matches(self, text, *, min_coverage):
            if "파리" in text:
                return [{"benchmark": "demo", "item_id": "q-1", "coverage": 1.0}]
            return []

    conversations = chat_data.read_conversations(pretrained / "chat_plain.jsonl")
    s = config(pretrained).sft
    kept, report = sft_data.decontaminate(conversations, Index(), s)
    dirty = [c for c in conversations if "파리" in chat_data.conversation_text(c["messages"])]
    assert report["checked"] and report["dropped"] == len(dirty) > 0
    assert len(kept) == len(conversations) - len(dirty)
    s = config(pretrained, **{"sft.contaminated": "fail"}).sft
    with pytest.raises(UserError, match="benchmark items"):
        sft_data.decontaminate(conversations, Index(), s)


def test_real_decontam_index_when_available(pretrained):
    """With the run's real decontam index (when the decontam stage has run), the check runs."""
    from hanlm.stages.run_facts import decontam_index as load_run_index

    if load_run_index(pretrained) is None:
        pytest.skip("this run has no decontam index")
    conversations = chat_data.read_conversations(pretrained / "chat_plain.jsonl")
    index = load_run_index(pretrained)
    _, report = sft_data.decontaminate(conversations, index, config(pretrained).sft)
    assert report["checked"]


def test_a_damaged_source_model_is_refused(pretrained, tmp_path):
    data = {"sft.data": str(pretrained / "chat_plain.jsonl"), "sft.max_steps": 1}
    for damage in ("truncated weights", "pickle weights"):
        folder, phrase = damaged_copy(
            pretrained / "pretrain" / "hf", tmp_path / damage.replace(" ", "_"), damage
        )
        cfg = config(pretrained, **{**data, "sft.model": str(folder)})
        marker = pretrained / "sft" / "stage.json"
        finished = marker.is_file() and marker.read_bytes()
        with pytest.raises(UserError, match=phrase):
            run_stage("sft", cfg, pretrained)
        assert (marker.is_file() and marker.read_bytes()) == finished  # refused before writing
    run_dir = tmp_path / "run"
    shutil.copytree(pretrained, run_dir, ignore=shutil.ignore_patterns("sft"))
    [shard] = (run_dir / "pretrain" / "checkpoints" / "step-00000008").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(UserError, match=r"pretraining checkpoint .* is damaged"):
        run_stage("sft", config(run_dir, **data), run_dir)
    assert not (run_dir / "sft" / "stage.json").exists()


def test_bad_inputs(pretrained, tmp_path, cli):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "narrator", "content": "x"}]}\n')
    result = cli("sft", "--run", pretrained, "--data", bad, "--set", "sft.max_steps=1")
    assert_user_error(result, "unknown role", f"{bad}:1")
    with pytest.raises(UserError, match="not a Hugging Face model folder"):
        run_stage("sft", config(pretrained, **{"sft.model": str(tmp_path)}), pretrained)
    with pytest.raises(UserError, match="no pretrained model"):
        run_stage("sft", config(tmp_path), tmp_path)
    run_dir = copy_of(pretrained, tmp_path / "o2")
    with pytest.raises(UserError, match="batch_rows"):
        run_stage("sft", config(run_dir, **{"sft.batch_rows": 12, "sft.data": str(
            pretrained / "chat_plain.jsonl")}), run_dir)  # fmt: skip


def test_sft_in_fp8_emulate_trains_fp8_and_exports_plain_weights(pretrained, tmp_path, monkeypatch):
    """SFT honours fp8 (here its CPU emulation) as pretraining does: the loaded model's large
    linear layers train through Float8Linear, and the export is a plain transformers model."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quick = {
        "sft.data": str(pretrained / "chat_plain.jsonl"),
        "sft.max_steps": 4,
        "sft.heldout": 4,
        "sft.closure_max_tokens": 4,
        "sft.logging.log_every": 1,
        "sft.checkpoint.every": 4,
        "sft.compare": [],
    }
    converted = []
    apply_fp8 = precision.apply_fp8

    def recording_apply_fp8(model, numerics, **options):
        converted.append((numerics.name, apply_fp8(model, numerics, **options)))
        return converted[-1][1]

    monkeypatch.setattr(precision, "apply_fp8", recording_apply_fp8)
    runs = {}
    for mode in ("fp32", "fp8-emulate"):
        run_dir = copy_of(pretrained, tmp_path / mode)
        out = run_dir / "sft"
        run_stage("sft", config(run_dir, **{**quick, "precision.mode": mode}), run_dir)
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[mode] = [r["loss"] for r in lines if "loss" in r]
    fp32, fp8 = runs["fp32"], runs["fp8-emulate"]
    assert len(fp8) == len(fp32) == 4
    names = {mode: layers for mode, layers in converted}  # the main SFT and its ablations
    assert names["fp32"] == []  # fp32: nothing converted; fp8: every projection but the head
    assert len(names["fp8-emulate"]) == 10 and "lm_head" not in names["fp8-emulate"]
    assert fp8 != fp32  # FP8 rounding happened in training
    assert all(abs(a - b) / a < 0.02 for a, b in zip(fp32, fp8, strict=True))

    hf = tmp_path / "fp8-emulate" / "sft" / "hf"
    plain_file = tmp_path / "fp32" / "sft" / "hf" / "model.safetensors"
    with (
        safe_open(str(hf / "model.safetensors"), "pt") as exported,
        safe_open(str(plain_file), "pt") as plain,
    ):
        assert set(exported.keys()) == set(plain.keys())
        key = "model.layers.0.mlp.down_proj.weight"
        assert exported.get_tensor(key).dtype == plain.get_tensor(key).dtype
    model = AutoModelForCausalLM.from_pretrained(str(hf))  # plain transformers, no hanlm
    assert all(type(m).__name__ != "Float8Linear" for m in model.modules())
    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    prompt = tokenizer("안녕하세요", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert prompt["input_ids"].shape[1] < generated.shape[1] <= prompt["input_ids"].shape[1] + 5


@pytest.mark.slow
def test_sft_under_fsdp_moves_the_new_rows_as_one_process(pretrained, tmp_path):
    """`hanlm sft` with `sft.new_token_lr_scale` under torchrun with 2 FSDP2 ranks, in
    fp8-emulate (FSDP fills a meta shell converted to Float8Linear): the exported model, new
    rows included, is the one-process SFT's (the same global batches, 4 rows a rank). In fp32,
    test_chat_tokens checks the same rows under FSDP2 with tied and untied heads."""
    from safetensors.torch import load_file

    quick = {
        "precision.mode": "fp8-emulate",
        "sft.data": str(pretrained / "chat_plain.jsonl"),
        "sft.max_steps": 3,
        "sft.micro_batch": 4,
        "sft.heldout": 4,
        "sft.closure_max_tokens": 4,
        "sft.compare": [],
        "sft.logging.log_every": 1,
        "sft.checkpoint.every": 3,
    }
    alone_run = copy_of(pretrained, tmp_path / "alone")
    alone = alone_run / "sft"
    # One thread, as each rank below: with two, float sums run in another order, and FP8's
    # per-tensor scales turn those last-bit differences into different roundings.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_stage("sft", config(alone_run, **quick), alone_run)
    finally:
        torch.set_num_threads(threads)
    run_dir = tmp_path / "run"
    shutil.copytree(pretrained, run_dir, ignore=shutil.ignore_patterns("sft"))
    settings = {**TINY_PRETRAIN, **TINY_SFT, **quick, "parallel.mode": "fsdp"}
    args = [a for k, v in settings.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "hanlm", "sft", "--run-dir", str(run_dir), *args]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "new_token_lr_scale is not applied" not in result.stderr + result.stdout
    assert "fp8 layers: 10" in result.stderr

    special = json.loads((pretrained / "tokenizer" / "special_tokens.json").read_text())
    new = [special[name]["id"] for name in ("system", "user", "assistant", "eot")]
    one = load_file(alone / "hf" / "model.safetensors")
    two = load_file(run_dir / "sft" / "hf" / "model.safetensors")
    start = load_file(pretrained / "pretrain" / "hf" / "model.safetensors")
    key = "model.embed_tokens.weight"
    assert (one[key][new] - start[key][new]).abs().min() > 0  # the new rows did move
    for name, weight in one.items():
        torch.testing.assert_close(
            two[name], weight, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_chat_data_in_two_shapes_mixed_by_weight(pretrained, tmp_path):
    """[[sft.sources]]: the demo's chats as ShareGPT rows and as Alpaca rows (their single-turn
    ones), mixed 70/30; the SFT data report says each source's format, rows and share, and the
    benchmark check ran over the mix."""
    chats = chat_data.read_conversations(pretrained / "chat_plain.jsonl")
    sharegpt = [{"id": c["id"], "conversations": [
        {"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
         "value": m["content"]} for m in c["messages"]]} for c in chats]  # fmt: skip
    alpaca = [{"instruction": c["messages"][-2]["content"], "output": c["messages"][-1]["content"]}
              for c in chats if [m["role"] for m in c["messages"][-2:]] == ["user", "assistant"]]  # fmt: skip
    sources = [
        {"name": "dialogs", "inputs": [str(write_jsonl(tmp_path / "sg.jsonl", sharegpt))], "weight": 0.7},
        {"name": "tasks", "inputs": [str(write_jsonl(tmp_path / "al.jsonl", alpaca))], "weight": 0.3,
         "max_epochs": 10},
    ]  # fmt: skip
    run_dir = copy_of(pretrained, tmp_path / "run")
    summary = run_stage("sft", config(run_dir, **{"sft.sources": sources, "sft.max_steps": 4}),
                        run_dir)  # fmt: skip
    report = json.loads((run_dir / "sft" / "data.json").read_text())
    total = len(sharegpt) + len(alpaca)
    assert report["sources"]["dialogs"]["format"] == "sharegpt"
    assert report["sources"]["tasks"]["format"] == "alpaca"
    assert report["sources"]["dialogs"]["format_detected"]
    assert report["sources"]["tasks"]["taken"] == round(0.3 * total)
    assert sum(s["taken"] for s in report["sources"].values()) == total
    assert report["contamination"]["checked"] and summary.step == 4
