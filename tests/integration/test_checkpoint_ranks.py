"""Checkpoints over 2 gloo ranks: each rank checksums its own files in the save thread, rank 0
gathers them into the manifest, a damaged file of rank 1 is caught; under DDP rank 0 alone stages
and writes the replicated state, and both layouts load back bit for bit."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hanlm import model as model_lib
from hanlm.train import checkpoint, checkpoint_layout, parallel
from hanlm.train.checkpoint_layout import latest, verify, write_manifest
from hanlm.train.checkpoint_manager import CheckpointManager
from hanlm.train.loss import TokenLoss
from hanlm.train.optim import adamw

MODES = ("ddp", "fsdp")


def _trained(d: parallel.Dist, mode: str, seed: int):
    """A tiny model wrapped for `mode` after one AdamW step (so the optimizer has state)."""
    config = model_lib.model_config("tiny", vocab_size=128, seq_len=16)
    model = parallel.parallelize(model_lib.build_model(config, seed=0), d, mode)
    optimizer = adamw(
        model, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=d.device
    )
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed + d.rank))
    # parallelize's result ends in the loss (hanlm.train.loss)
    model(labels=tokens[:, 1:], loss_fn=TokenLoss().sums, input_ids=tokens[:, :-1])[
        "loss"
    ].backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def _local(state: dict) -> dict:
    from torch.distributed.tensor import DTensor

    def plain(v):
        return v.to_local() if isinstance(v, DTensor) else v

    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in _local(value).items()})
        elif isinstance(value, torch.Tensor):
            out[key] = plain(value).clone()
    return out


def _tensors(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(parallel.unwrap(model), optimizer)
    return _local({"model": model_sd, "optim": optim_sd})


def _worker(rank: int, world: int, root: str, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    d = parallel.Dist(rank, world, rank, torch.device("cpu"))
    # Which thread checksummed which file: the training thread must only do trainer.json.
    seen: list[tuple[str, str]] = []
    original = checkpoint_layout._checksum

    def recording(path):
        seen.append((Path(path).name, threading.current_thread().name))
        return original(path)

    checkpoint_layout._checksum = recording
    report: dict = {}
    for mode in MODES:
        seen.clear()
        model, optimizer = _trained(d, mode, seed=1)
        manager = CheckpointManager(Path(root) / mode, d, checkpoint_layout.Policy())
        manager.save(1, parallel.unwrap(model), optimizer, {"step": 1})  # asynchronous
        manager.close()
        saved = _tensors(model, optimizer)
        other, other_opt = _trained(d, mode, seed=7)  # other weights and moments
        checkpoint.load(latest(manager.root), parallel.unwrap(other), other_opt)
        loaded = _tensors(other, other_opt)
        report[mode] = {
            "checksummed": seen[:],
            "bit_exact": saved.keys() == loaded.keys()
            and all(torch.equal(saved[k], loaded[k]) for k in saved),
        }
    (Path(root) / f"report-{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(2, str(root), str(root / "init")), nprocs=2, join=True)
    reports = [json.loads((root / f"report-{r}.json").read_text()) for r in range(2)]
    return root, reports


def _manifest(root: Path, mode: str) -> dict:
    folder = latest(root / mode)
    return json.loads((folder / "manifest.json").read_text())["files"]


@pytest.mark.parametrize("mode", MODES)
def test_resume_is_bit_exact_on_every_rank(saved, mode):
    _, reports = saved
    assert [r[mode]["bit_exact"] for r in reports] == [True, True]


@pytest.mark.parametrize("mode", MODES)
def test_each_rank_checksums_its_files_in_the_save_thread(saved, mode):
    root, reports = saved
    files = _manifest(root, mode)
    assert verify(latest(root / mode)) is None
    for rank, report in enumerate(reports):
        names = {name for name, _ in report[mode]["checksummed"]}
        mine = {rel for rel, entry in files.items() if entry["rank"] == rank}
        assert names == mine  # every rank checksummed exactly the files listed as its own
        for name, thread in report[mode]["checksummed"]:
            if name != "trainer.json":
                assert thread != "MainThread", (rank, name)
    assert files["trainer.json"]["rank"] == 0 and files[".metadata"]["rank"] == 0


def test_fsdp_rank_one_writes_its_shards_and_damage_is_caught(saved):
    root, _ = saved
    files = _manifest(root, "fsdp")
    ones = [rel for rel, entry in files.items() if entry["rank"] == 1]
    assert ones and all(rel.startswith("__1_") for rel in ones)
    folder = latest(root / "fsdp")
    damaged = folder / ones[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert verify(folder) == f"{ones[0]} fails its checksum (written by rank 1)"


def test_ddp_stages_and_writes_on_rank_zero_only(saved):
    root, reports = saved
    files = _manifest(root, "ddp")
    shards = [rel for rel in files if rel.endswith(".distcp")]
    assert shards and all(rel.startswith("__0_") for rel in shards)
    assert {entry["rank"] for entry in files.values()} == {0}
    assert reports[1]["ddp"]["checksummed"] == []  # rank 1 wrote nothing


def test_manifests_without_ranks_still_verify(tmp_path):
    folder = tmp_path / "step-00000001"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"weights" * 100)
    (folder / "trainer.json").write_text("{}")
    manifest = write_manifest(folder)
    old = {rel: {k: v for k, v in e.items() if k != "rank"} for rel, e in manifest["files"].items()}
    (folder / "manifest.json").write_text(json.dumps({"files": old}))
    assert verify(folder) is None
    (folder / "__0_0.distcp").write_bytes(b"weighs" * 100 + b"t" * 100)
    assert verify(folder) == "__0_0.distcp fails its checksum"
