"""SFT's start without a whole copy of the pretrained model per rank (hanlm.train.pretrained):
the model built on meta, placed, then read from the source by parts equals the whole model
loaded the old way, bit for bit; under torchrun with FSDP2 (each rank reading only its rows)
and DDP too, and it trains as one process does."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file

from conftest import run_two_rank_worker
from hanlm import inference
from hanlm.chat import tokens
from hanlm.errors import UserError
from hanlm.model import build_model, model_config
from hanlm.train import checkpoint_layout, export, parallel, pretrained, sft

VOCAB = 301


def _config(tied: bool):
    config = model_config("tiny", vocab_size=VOCAB, seq_len=32)
    config.tie_word_embeddings = tied
    return config


def hf_folder(path: Path, *, tied: bool, dtype: torch.dtype) -> Path:
    """A Hugging Face folder as `hanlm export` writes it (no tokenizer: none is read here)."""
    model = build_model(_config(tied), seed=3).to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    export._portable_model_config(path / "config.json", export.EXPORT_DTYPES[dtype])
    return path


def checkpoint_folder(path: Path, *, tied: bool) -> Path:
    """A pretraining checkpoint's model part, with its manifest, as one process writes it."""
    model = build_model(_config(tied), seed=4)
    state = {"model": dict(model.state_dict())}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    checkpoint_layout.write_manifest(path)
    return path


def hf_source(path: Path) -> sft.SftSource:
    return sft.SftSource(kind="hf", path=path, tokenizer_dir=path, fingerprint="")


def checkpoint_source(path: Path, tied: bool) -> sft.SftSource:
    return sft.SftSource(
        kind="checkpoint", path=path, tokenizer_dir=path, fingerprint="", model_config=_config(tied)
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    return {
        "hf-tied-bf16": hf_source(hf_folder(root / "a", tied=True, dtype=torch.bfloat16)),
        "hf-untied-fp32": hf_source(hf_folder(root / "b", tied=False, dtype=torch.float32)),
        "checkpoint-tied": checkpoint_source(checkpoint_folder(root / "c", tied=True), True),
        "checkpoint-untied": checkpoint_source(checkpoint_folder(root / "d", tied=False), False),
    }


def _alone(source: sft.SftSource):
    """The model placed in one process the new way: built on meta, allocated, filled."""
    model, problem = sft.model_on_meta(source)
    assert problem is None
    d = parallel.Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    fill = lambda m: pretrained.fill(m, source.kind, source.path)  # noqa: E731
    return parallel.unwrap(parallel.parallelize_loaded(model, d, "single", fill=fill))


@pytest.mark.parametrize(
    "name", ["hf-tied-bf16", "hf-untied-fp32", "checkpoint-tied", "checkpoint-untied"]
)
def test_filled_by_parts_equals_the_whole_load(sources, name):
    source = sources[name]
    model = _alone(source)
    whole, _ = sft.load_source_model(source)
    assert model.training and all(p.dtype == torch.float32 for p in model.parameters())
    assert not any(p.is_meta for p in model.parameters())
    assert tokens.is_tied(model) == tokens.is_tied(whole) == ("untied" not in name)
    for key, value in whole.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    for key, value in whole.named_buffers():
        assert torch.equal(dict(model.named_buffers())[key], value), key


@pytest.mark.parametrize("name", ["hf-untied-fp32", "checkpoint-tied"])
def test_the_audit_reads_only_the_token_matrices(sources, name):
    source = sources[name]
    model, _ = sft.model_on_meta(source)
    model = pretrained.with_token_matrices(model, source.kind, source.path)
    whole, _ = sft.load_source_model(source)
    real = sorted(n for n, p in model.named_parameters() if not p.is_meta)
    assert real == (["lm_head.weight", "model.embed_tokens.weight"] if "untied" in name else
                    ["model.embed_tokens.weight"])  # fmt: skip
    assert tokens.is_tied(model) == tokens.is_tied(whole)
    for key, weight in tokens.matrices(whole).items():
        assert torch.equal(tokens.matrices(model)[key], weight), key


def test_a_folder_that_does_not_fit_is_named_and_loaded_whole(sources, tmp_path, capsys):
    """A tensor the model lacks, a missing one, a wrong shape, a tie saved twice: each is a
    reason to read the whole model the old way (which from_pretrained knows how to do)."""
    folder = sources["hf-untied-fp32"].path
    tensors = load_file(folder / "model.safetensors")
    model = build_model(inference.read_config(folder), device="meta")
    cases = {
        "holds tensors the model lacks (extra.weight)": {**tensors, "extra.weight": torch.ones(2)},
        "no tensor lm_head.weight": {k: v for k, v in tensors.items() if k != "lm_head.weight"},
        "has shape (2, 64)": {**tensors, "lm_head.weight": torch.ones(2, 64)},
    }
    for reason, content in cases.items():
        save_file(content, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
        assert reason in pretrained.mismatch(model, "hf", tmp_path), reason
    tied = build_model(_config(True), device="meta")
    both = {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()}
    save_file(both, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert "tied tensors" in pretrained.mismatch(tied, "hf", tmp_path)
    assert pretrained.mismatch(model, "hf", folder) is None


def test_sft_places_a_folder_that_does_not_fit_by_loading_it_whole(sources, tmp_path, capsys):
    from hanlm.config import Config
    from hanlm.train import precision

    folder = shutil.copytree(sources["hf-untied-fp32"].path, tmp_path / "odd")
    tensors = load_file(folder / "model.safetensors")
    extra = {**tensors, "extra.weight": torch.ones(2)}  # from_pretrained drops it with a warning
    save_file(extra, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = Config.model_validate({"parallel": {"device": "cpu"}, "sft": {"packing": False}})
    d = parallel.Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    numerics = precision.resolve("fp32", d.device)
    root, _, _ = sft._placed_model(cfg, hf_source(folder), numerics, d, "single")
    assert "every rank loads the whole source model" in capsys.readouterr().err
    placed = parallel.unwrap(root).state_dict()
    for key, value in tensors.items():
        assert torch.equal(placed[key], value), key


def test_a_damaged_checkpoint_is_refused_before_anything_is_built(sources, tmp_path):
    folder = shutil.copytree(sources["checkpoint-tied"].path, tmp_path / "step")
    data = next(p for p in folder.iterdir() if p.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(UserError, match="damaged"):
        sft.model_on_meta(checkpoint_source(folder, True))


VARIANTS = [
    {"source": "hf-tied-bf16", "mode": "fsdp", "init": "mean", "train_steps": 3},
    {"source": "checkpoint-untied", "mode": "fsdp", "init": "mean-cov", "train_steps": 3},
    {"source": "checkpoint-tied", "mode": "ddp", "init": "mean-cov"},
    {"source": "hf-untied-fp32", "mode": "fsdp", "init": "mean", "precision": "fp8-emulate"},
]


@pytest.mark.slow
def test_under_torchrun_every_rank_reads_its_rows_and_trains_as_one_process(sources, tmp_path):
    worker = Path(__file__).parents[1] / "workers" / "sft_load_worker.py"
    variants = []
    for v in VARIANTS:
        source = sources[v["source"]]
        tied = "untied" not in v["source"]
        variants.append({**v, "kind": source.kind, "path": str(source.path), "tied": tied})
    result = run_two_rank_worker(worker, tmp_path, *map(json.dumps, variants))
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        got_all = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for variant, got in zip(variants, got_all, strict=True):
            assert got["differ"] == [] and got["compared"] > 0, (rank, variant, got)
            assert got["tied"] == variant["tied"]
            sharded = variant["mode"] == "fsdp"
            assert got["largest_share"] <= (0.51 if sharded else 1.0), (variant, got)
            assert (got["fp8_layers"] > 0) == (variant.get("precision") == "fp8-emulate")
            if variant.get("train_steps"):
                assert got["rows_moved"] > 0  # the new rows did move
                assert got["trained_max_difference"] < 1e-5, (variant, got)
