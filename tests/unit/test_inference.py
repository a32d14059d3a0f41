"""hanlm.inference's one device and dtype rule (the model paths are tested through their
callers: test_generate, test_chat_cli, test_harness, test_doctor, test_distill, test_sft)."""

import pytest
import torch

from hanlm.errors import UserError
from hanlm.inference import left_padded, resolve_device, resolve_dtype


@pytest.fixture
def two_gpus(monkeypatch):
    """CUDA as it looks with two GPUs visible (no GPU is needed to judge the rule)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_the_cpu_without_cuda(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_cuda_without_a_gpu_names_the_setting(no_gpu):
    for name in ("cuda", "cuda:1"):
        with pytest.raises(UserError, match=r"pretrain\.device is cuda") as caught:
            resolve_device(name, setting="pretrain.device")
        assert "--set pretrain.device=cpu" in caught.value.fix


def test_unknown_device_lists_the_choices():
    with pytest.raises(UserError, match="unknown device 'gpu0'") as caught:
        resolve_device("gpu0")
    assert caught.value.fix == "use auto, cpu, cuda or cuda:N"


def test_auto_and_cuda_with_gpus(two_gpus):
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(UserError, match="only 2 CUDA GPU"):
        resolve_device("cuda:2", setting="generate.device")


def test_a_torchrun_process_gets_its_local_ranks_gpu(two_gpus):
    assert resolve_device("auto", local_rank=3) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=0) == torch.device("cuda", 0)
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)  # as named
    assert resolve_device("cpu", local_rank=1) == torch.device("cpu")


def test_dtypes():
    assert resolve_dtype("auto") is None  # the folder's own, as transformers loads by default
    assert resolve_dtype("fp32") == torch.float32
    assert resolve_dtype("bf16") == torch.bfloat16
    with pytest.raises(UserError, match="unknown dtype 'fp64'"):
        resolve_dtype("fp64")


def test_left_padding():
    ids, mask = left_padded([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_an_answer_past_the_context_prints_no_reminder_and_other_records_still_show(caplog):
    """hanlm lets an answer run past max_position_embeddings on purpose: transformers' reminder
    is dropped, and nothing else its stopping criteria log."""
    import logging

    from transformers.generation.stopping_criteria import MaxLengthCriteria

    import hanlm.inference.generation  # noqa: F401 - installs the filter

    logger = logging.getLogger("transformers.generation.stopping_criteria")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        MaxLengthCriteria(400, 256)(torch.zeros(1, 300, dtype=torch.long), None)
        logger.warning("another record")
    messages = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert messages == ["another record"]
