"""Distillation: the loss against a hand computation, the teacher checks, pretraining with it."""

import json
import math
import shutil

import pytest
import torch

from conftest import TINY_PRETRAIN, metrics
from damaged_models import damaged_copy
from hanlm.config import DistillSection
from hanlm.errors import UserError
from hanlm.pipeline import run_stage
from hanlm.stages import export
from hanlm.stages.rundir import load_run_config
from hanlm.train import distill
from hanlm.train.loss import TokenLoss

TINY = {
    **TINY_PRETRAIN,
    "pretrain.max_steps": 4,
    "logging.eval_every": 4,
    "logging.eval_batches": 1,
}


def softmax(row, temperature):
    exps = [math.exp(v / temperature) for v in row]
    total = sum(exps)
    return [e / total for e in exps]


def test_kd_loss_equals_a_hand_computation():
    student = [[[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], [[2.0, 2.0, 2.0], [0.3, 0.1, -0.4]]]
    teacher = [[[0.5, 2.5, 0.0], [1.0, 0.0, 1.0]], [[9.0, 9.0, 9.0], [-1.0, 2.0, 0.0]]]
    labels = [[1, 2], [-100, 0]]  # one position ignored
    alpha, temperature = 0.3, 2.0

    ce = kl = 0.0
    for b in range(2):
        for t in range(2):
            if labels[b][t] == -100:
                continue
            ce -= math.log(softmax(student[b][t], 1.0)[labels[b][t]])
            p = softmax(teacher[b][t], temperature)
            q = softmax(student[b][t], temperature)
            kl += sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q, strict=True))
    expected = (1 - alpha) * ce + alpha * temperature**2 * kl

    sums = distill.kd_loss_sums(
        torch.tensor(student, requires_grad=True),
        torch.tensor(teacher),
        torch.tensor(labels),
        alpha=alpha,
        temperature=temperature,
    )
    assert sums["ce"].item() == pytest.approx(ce, rel=1e-5)
    assert sums["kl"].item() == pytest.approx(kl, rel=1e-5)
    assert sums["loss"].item() == pytest.approx(expected, rel=1e-5)
    sums["loss"].backward()  # the total is differentiable; the logged parts are detached
    assert not sums["ce"].requires_grad and not sums["kl"].requires_grad


def test_kd_loss_with_alpha_zero_is_plain_cross_entropy():
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    sums = distill.kd_loss_sums(logits, torch.randn(2, 5, 11), labels, alpha=0.0, temperature=1.0)
    expected = torch.nn.functional.cross_entropy(
        logits.view(-1, 11), labels.view(-1), reduction="sum"
    )
    assert sums["loss"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_off_by_default_gives_no_objective():
    assert distill.make_objective(DistillSection(), 1024, "cpu") is None


# --- with a real teacher ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher(demo_run, tmp_path_factory):
    """A tiny model trained 4 steps on the demo run and exported: the teacher."""
    run_dir = tmp_path_factory.mktemp("distill") / "run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    cfg = load_run_config(run_dir, values=TINY)
    run_stage("pretrain", cfg, run_dir)
    out = run_dir / "pretrain" / "hf"
    export.export_chosen(cfg, run_dir, checkpoint=None, out=out, force=False)
    return run_dir, out


def vocab_size(folder):
    return json.loads((folder / "config.json").read_text())["vocab_size"]


def test_the_objective_runs_the_teacher_in_inference_mode_and_matches_its_logits(teacher):
    run_dir, folder = teacher
    cfg = DistillSection(enabled=True, teacher=str(folder), alpha=0.5, temperature=2.0)
    size = vocab_size(folder)
    objective_for = distill.make_objective(
        cfg, size, "cpu", student_tokenizer=run_dir / "tokenizer"
    )
    assert not objective_for.teacher.training
    assert not any(p.requires_grad for p in objective_for.teacher.parameters())
    inputs = torch.randint(0, size, (2, 6))
    labels = inputs.roll(-1, dims=1)
    labels[:, -1] = -100
    hidden = torch.randn(2, 6, 16, requires_grad=True)
    head = torch.randn(size, 16, requires_grad=True)
    # the student's loss in chunks of 5 tokens, the teacher's logits made per chunk
    objective = objective_for(inputs, {})
    sums = TokenLoss(5).sums(hidden, head, labels, objective=objective)
    with torch.no_grad():
        teacher_logits = objective_for.teacher(input_ids=inputs).logits
    expected = distill.kd_loss_sums(
        hidden @ head.T, teacher_logits, labels, alpha=0.5, temperature=2.0
    )
    for part in ("loss", "ce", "kl"):
        assert sums[part].item() == pytest.approx(expected[part].item(), rel=1e-5), part
    sums["loss"].backward()
    assert hidden.grad is not None and head.grad is not None


def test_the_teacher_sees_packed_documents_apart(teacher):
    run_dir, folder = teacher
    cfg = DistillSection(enabled=True, teacher=str(folder), alpha=0.5, temperature=2.0)
    size = vocab_size(folder)
    objective_for = distill.make_objective(
        cfg, size, "cpu", student_tokenizer=run_dir / "tokenizer"
    )
    generator = torch.Generator().manual_seed(0)  # fixed: the two sums differ by a margin
    inputs = torch.randint(0, size, (1, 12), generator=generator)
    labels = inputs.roll(-1, dims=1)
    extra = {"position_ids": torch.cat([torch.arange(5), torch.arange(7)])[None]}
    hidden = torch.randn(1, 12, 16, generator=generator)
    head = torch.randn(size, 16, generator=generator)
    logits = hidden @ head.T
    sums = TokenLoss(5).sums(hidden, head, labels, objective=objective_for(inputs, extra))
    teacher = objective_for.teacher
    with torch.no_grad():  # each document alone
        parts = [teacher(input_ids=inputs[:, a:b]).logits for a, b in ((0, 5), (5, 12))]
        together = teacher(input_ids=inputs).logits
    alone = distill.kd_loss_sums(logits, torch.cat(parts, 1), labels, alpha=0.5, temperature=2.0)
    seen = distill.kd_loss_sums(logits, together, labels, alpha=0.5, temperature=2.0)
    # the teacher's second document changes when it sees the first: the check can tell them apart
    assert (together[:, 5:] - parts[1]).abs().max() > 1e-3
    gap = abs(alone["kl"].item() - seen["kl"].item())
    assert gap > 1e-5 * abs(alone["kl"].item())  # far above float32 rounding (~1e-7)
    assert sums["kl"].item() == pytest.approx(alone["kl"].item(), rel=1e-6, abs=gap / 100)


def test_a_different_vocabulary_size_is_refused(teacher):
    run_dir, folder = teacher
    cfg = DistillSection(enabled=True, teacher=str(folder))
    with pytest.raises(UserError, match=r"vocabulary mismatch.*1,024 output tokens.*2,048"):
        distill.make_objective(cfg, 2048, "cpu", student_tokenizer=run_dir / "tokenizer")


def test_a_different_tokenizer_is_refused(teacher, tmp_path):
    run_dir, folder = teacher
    # the same size, but one token moved: scores would land on the wrong ids
    other = tmp_path / "other_tokenizer"
    other.mkdir()
    data = json.loads((run_dir / "tokenizer" / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(data))
    cfg = DistillSection(enabled=True, teacher=str(folder))
    with pytest.raises(UserError, match=r"vocabulary mismatch.*differ at 2 token ids"):
        distill.make_objective(cfg, vocab_size(folder), "cpu", student_tokenizer=other)


@pytest.mark.parametrize("damage", ["truncated weights", "garbled header", "pickle weights"])
def test_a_damaged_teacher_is_refused_before_loading(teacher, tmp_path, damage):
    run_dir, folder = teacher
    damaged, phrase = damaged_copy(folder, tmp_path / "teacher", damage)
    cfg = DistillSection(enabled=True, teacher=str(damaged))
    with pytest.raises(UserError, match=phrase):
        distill.make_objective(
            cfg, vocab_size(folder), "cpu", student_tokenizer=run_dir / "tokenizer"
        )


def test_bad_teacher_settings_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no teacher"):
        distill.make_objective(DistillSection(enabled=True), 1024, "cpu")
    with pytest.raises(UserError, match=r"no config\.json"):
        distill.make_objective(DistillSection(enabled=True, teacher=str(tmp_path)), 1024, "cpu")


def test_pretraining_with_distillation_logs_ce_and_kl(teacher, tmp_path):
    source, folder = teacher
    run_dir = tmp_path / "student"
    shutil.copytree(source, run_dir, ignore=shutil.ignore_patterns("pretrain"))
    values = {
        **TINY,
        "pretrain.max_steps": 2,
        "distill.enabled": True,
        "distill.teacher": str(folder),
        "distill.alpha": 0.5,
    }
    run_stage("pretrain", load_run_config(run_dir, values=values), run_dir)
    rows = [r for r in metrics(run_dir) if "loss" in r]
    assert rows and all("ce" in r and "kl" in r for r in rows)
    for r in rows:  # the logged total is the mix of the logged parts
        expected = 0.5 * r["ce"] + 0.5 * 2.0**2 * r["kl"]
        assert r["loss"] == pytest.approx(expected, rel=1e-3)
