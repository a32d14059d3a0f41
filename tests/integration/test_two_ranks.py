"""Library pieces under two gloo ranks, checked against one process: the FSDP2 meta build and
its loaded variant (bit for bit the eager build), the chunked loss and its gradients under DDP
and FSDP2, the new token rows' step scale under FSDP2, and LoRA (PEFT) under FSDP2. One torchrun launch runs every check
(tests/workers/two_rank_checks.py); each test reads what its check wrote."""

import json
from pathlib import Path

import fsdp_init_ranks
import lora_ranks
import loss_ranks
import pytest
import row_scale_training
import torch

from conftest import assert_close, run_two_rank_worker
from hanlm.chat import tokens

CHECKS = Path(__file__).parents[1] / "workers" / "two_rank_checks.py"
RTOL = 1e-5


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_ranks")
    result = run_two_rank_worker(CHECKS, out)
    return out, result


def finished(launch, name: str) -> Path:
    """The check's folder, once both ranks finished it; else the failure, as the rank saw it."""
    out, result = launch
    folder = out / name
    if not all((folder / f"done-{rank}").is_file() for rank in (0, 1)):
        errors = [p.read_text() for p in sorted(folder.glob("error-*.txt"))]
        pytest.fail(f"check {name!r} did not finish on both ranks:\n" + "\n".join(errors or [
            f"(no traceback; the launch exited {result.returncode})\n{result.stderr[-3000:]}"
        ]))  # fmt: skip
    return folder


@pytest.mark.slow
def test_fsdp_meta_init_equals_the_eager_build(launch):
    folder = finished(launch, "fsdp_init")
    for rank in (0, 1):
        results = json.loads((folder / f"rank-{rank}.json").read_text())
        for variant, got in zip(fsdp_init_ranks.VARIANTS, results, strict=True):
            assert got["meta"], variant
            assert got["differ"] == [] and got["compared"] > 0, (rank, variant, got)
            assert got["tied"] and got["on_meta"] == [] and got["training"]
            assert got["largest_share"] <= 0.5  # no rank holds a whole parameter
            assert (got["fp8_layers"] > 0) == (variant.get("precision") == "fp8-emulate")


@pytest.mark.slow
@pytest.mark.parametrize("mode", loss_ranks.MODES)
def test_the_chunked_loss_and_gradients_equal_one_process(launch, mode):
    got = torch.load(finished(launch, "loss") / f"{mode}.pt", weights_only=True)
    assert got["tied"]
    assert got["loss"].item() == pytest.approx(got["expected_loss"].item(), rel=RTOL)
    assert set(got["grads"]) == set(got["expected_grads"])
    assert "model.embed_tokens.weight" in got["grads"]
    for name, want in got["expected_grads"].items():
        assert got["grads"][name] is not None, name
        assert_close(got["grads"][name], want)


@pytest.mark.slow
def test_row_step_scale_under_fsdp_moves_rows_as_one_process(launch):
    """Token rows sharded 151 / 150: the new rows, on both ranks, move as on one process, and
    the step scale touches no other row; tied and untied heads."""
    run = row_scale_training
    sharded = torch.load(finished(launch, "row_scale") / "sharded.pt", weights_only=True)
    new, others = run.NEW_IDS, [i for i in range(run.VOCAB) if i not in run.NEW_IDS]
    for tied in (True, False):
        alone = run.train(run.tiny(tied), run.SCALE, run.STEPS)
        got = sharded[(tied, run.SCALE, run.STEPS)]
        assert set(got) == ({"embedding"} if tied else {"embedding", "head"})
        for name, weight in alone.items():
            torch.testing.assert_close(got[name], weight, rtol=1e-5, atol=1e-6)
        # one step: the new rows moved SCALE times as far, every other row as without scaling
        start = {name: w.detach() for name, w in tokens.matrices(run.tiny(tied)).items()}
        scaled, plain = sharded[(tied, run.SCALE, 1)], sharded[(tied, 1.0, 1)]
        for name in start:
            moved, moved_plain = scaled[name] - start[name], plain[name] - start[name]
            assert moved_plain[new].abs().min() > 0
            torch.testing.assert_close(moved[new], run.SCALE * moved_plain[new])
            assert torch.equal(scaled[name][others], plain[name][others])


@pytest.mark.slow
def test_lora_under_fsdp_trains_as_one_process(launch):
    """PEFT's adapters and trainable rows, sharded with the frozen weights of their blocks, end
    where one process ends them; the frozen weights do not move."""
    sharded = torch.load(finished(launch, "lora") / "sharded.pt", weights_only=True)
    start = {name: p.detach().clone() for name, p in lora_ranks.injected().named_parameters()}
    alone = lora_ranks.train(lora_ranks.injected())
    assert set(sharded) == set(alone)
    trainable = {n for n, p in lora_ranks.injected().named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("trainable_tokens" in n for n in trainable)
    for name, weight in alone.items():
        torch.testing.assert_close(sharded[name], weight, rtol=1e-5, atol=1e-6, msg=name)
        assert torch.equal(weight, start[name]) != (name in trainable), name
