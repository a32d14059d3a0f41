"""Distillation toward a teacher model: an option of pretraining and SFT, off by default.

    loss = (1 - alpha) * CE(student, labels) + alpha * T^2 * KL(teacher_T || student_T)

summed over the target tokens (labels != -100), both distributions softened at temperature T
(T^2 keeps the KL term's gradient on the CE term's scale; Hinton et al. 2015). The Trainer
divides the sums by the global token count and logs "ce" and "kl" per token apart from the
total. The teacher is any Hugging Face causal LM folder with the student's tokenizer; it runs
in inference mode, optionally on another device; on packed rows it sees each document alone,
as the student does (hanlm.train.document_attention). Like the plain loss (hanlm.train.loss),
the sums are taken a chunk of tokens at a time: the teacher's decoder runs on the micro-batch,
its logits are made per chunk from its hidden states, beside the student's.

A field report found that distilling toward a larger teacher during pretraining made every
domain worse: benchmarks/distill_ablation.py measures it on the demo world.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from hanlm.config import DistillSection
from hanlm.errors import UserError
from hanlm.inference import load_folder, read_config, resolve_device
from hanlm.train import document_attention
from hanlm.train.loss import IGNORE, Objective, check_plain_head

PACKING_SETTINGS = "sft.packing (or pretrain.document_masking)"  # what packs documents in a row
# (a micro-batch's token ids, its extra model inputs) -> the loss of its chunks (hanlm.train.loss)
ObjectiveFor = Callable[[torch.Tensor, dict], Objective]


def kd_loss_sums(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    alpha: float,
    temperature: float,
) -> dict[str, torch.Tensor]:
    """{"loss", "ce", "kl"}, each summed over the positions whose label is not IGNORE."""
    vocab = student_logits.size(-1)
    student = student_logits.float().reshape(-1, vocab)
    flat_labels = labels.reshape(-1)
    keep = flat_labels != IGNORE
    ce = F.cross_entropy(student, flat_labels, ignore_index=IGNORE, reduction="sum")
    student_kept = student[keep] / temperature
    teacher_kept = teacher_logits.float().reshape(-1, vocab)[keep] / temperature
    kl = F.kl_div(
        F.log_softmax(student_kept, dim=-1),
        F.log_softmax(teacher_kept, dim=-1),
        reduction="sum",
        log_target=True,
    )
    loss = (1.0 - alpha) * ce + alpha * temperature**2 * kl
    return {"loss": loss, "ce": ce.detach(), "kl": kl.detach()}


# --- the teacher -----------------------------------------------------------------------------------


def _tokenizer_vocab(path: Path) -> dict[str, int]:
    try:
        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception as e:  # a corrupt or foreign file: say which
        raise UserError(f"cannot read the tokenizer {path}: {e}") from None


def _tokenizer_file(folder: Path) -> Path:
    folder = Path(folder)
    path = folder / "tokenizer.json" if folder.is_dir() else folder
    if not path.is_file():
        raise UserError(
            f"no tokenizer.json in {folder}",
            fix="distillation needs the teacher and the student to share one tokenizer; "
            "give a teacher folder that holds tokenizer.json",
        )
    return path


def check_same_vocabulary(
    teacher_dir: Path, teacher_vocab_size: int, student_vocab_size: int, student_tokenizer=None
) -> None:
    """A UserError naming the mismatch unless the teacher scores the student's token ids."""
    if teacher_vocab_size != student_vocab_size:
        raise UserError(
            f"vocabulary mismatch: the teacher {teacher_dir} has {teacher_vocab_size:,} output "
            f"tokens, the student {student_vocab_size:,}",
            fix="distil from a teacher trained with the student's tokenizer (same vocabulary "
            "and padded size)",
        )
    teacher_file = _tokenizer_file(teacher_dir)
    if student_tokenizer is None:
        return
    student_file = _tokenizer_file(Path(student_tokenizer))
    teacher_vocab, student_vocab = _tokenizer_vocab(teacher_file), _tokenizer_vocab(student_file)
    if teacher_vocab != student_vocab:
        teacher_ids = {i: t for t, i in teacher_vocab.items()}
        student_ids = {i: t for t, i in student_vocab.items()}
        differing = sorted(
            i
            for i in set(teacher_ids) | set(student_ids)
            if teacher_ids.get(i) != student_ids.get(i)
        )
        examples = ", ".join(
            f"id {i}: {teacher_ids.get(i)!r} vs {student_ids.get(i)!r}" for i in differing[:3]
        )
        raise UserError(
            f"vocabulary mismatch: the teacher's tokenizer ({teacher_file}, {len(teacher_vocab):,} "
            f"tokens) and the student's ({student_file}, {len(student_vocab):,} tokens) differ at "
            f"{len(differing):,} token ids ({examples})",
            fix="distil from a teacher trained with the student's tokenizer",
        )


def load_teacher(cfg: DistillSection, device: torch.device) -> torch.nn.Module:
    # the vocabulary is checked on its own (check_same_vocabulary): no tokenizer needed here
    teacher = load_folder(
        cfg.teacher,
        tokenizer=False,
        device=device,
        failure="cannot load the teacher {path}",
        fix="give distill.teacher as a local Hugging Face causal LM folder",
    ).model
    teacher.requires_grad_(False)
    return teacher


def _teacher_device(name: str, student_device) -> torch.device:
    if name == "same":
        return torch.device(student_device)
    return resolve_device(name, setting="distill.teacher_device")


class TeacherObjective:
    """The distillation loss of a chunk of the student's tokens (an Objective): the teacher's
    logits for the same rows come from its final hidden states and its output head."""

    def __init__(
        self,
        teacher_hidden: torch.Tensor,
        teacher_head: torch.Tensor,
        *,
        alpha: float,
        temperature: float,
    ):
        self.hidden = teacher_hidden.reshape(-1, teacher_hidden.size(-1))
        self.head, self.alpha, self.temperature = teacher_head, alpha, temperature

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, rows: slice) -> dict:
        with torch.no_grad(), torch.autocast(self.hidden.device.type, enabled=False):
            # as the teacher's own forward, in its dtype; a plain tensor, not an inference one
            teacher_logits = F.linear(self.hidden[rows], self.head).to(logits.device)
        return kd_loss_sums(
            logits, teacher_logits, labels, alpha=self.alpha, temperature=self.temperature
        )


def make_objective(
    cfg_distill: DistillSection,
    student_vocab_size: int,
    device,
    *,
    student_tokenizer: str | Path | None = None,
) -> ObjectiveFor | None:
    """The Trainer's objective_for for distillation, or None when distillation is off.

    `student_tokenizer` (the student's tokenizer folder or tokenizer.json), when given, must
    hold the same vocabulary as the teacher's; the output sizes must match in any case."""
    if not cfg_distill.enabled:
        return None
    if not cfg_distill.teacher:
        raise UserError(
            "distillation is enabled but no teacher is given",
            fix="set distill.teacher to a Hugging Face model folder, or distill.enabled=false",
        )
    teacher_dir = Path(cfg_distill.teacher)
    config = read_config(  # checks the folder first
        teacher_dir,
        failure="cannot read the teacher's config in {path}",
        fix="give distill.teacher as a local Hugging Face causal LM folder",
    )
    teacher_vocab = config.get_text_config().vocab_size
    check_same_vocabulary(teacher_dir, teacher_vocab, student_vocab_size, student_tokenizer)
    teacher_device = _teacher_device(cfg_distill.teacher_device, device)
    teacher = load_teacher(cfg_distill, teacher_device)
    check_plain_head(teacher, f"the teacher {teacher_dir}")
    alpha, temperature = cfg_distill.alpha, cfg_distill.temperature
    prepared = False

    def objective_for(inputs: torch.Tensor, extra: dict | None = None) -> TeacherObjective:
        nonlocal prepared
        if extra and not prepared:  # the first packed batch: the teacher must mask documents too
            document_attention.prepare(teacher, teacher_device, "sdpa", setting=PACKING_SETTINGS)
            prepared = True
        extra = {name: value.to(teacher_device) for name, value in (extra or {}).items()}
        with torch.inference_mode():
            attention = document_attention.model_inputs(teacher, extra)
            decoder = teacher.get_decoder()
            hidden = decoder(
                input_ids=inputs.to(teacher_device), use_cache=False, **attention
            ).last_hidden_state
        head = teacher.get_output_embeddings().weight
        return TeacherObjective(hidden, head, alpha=alpha, temperature=temperature)

    objective_for.teacher = teacher  # type: ignore[attr-defined]  # for tests and inspection
    return objective_for
