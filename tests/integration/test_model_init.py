"""A model built on the meta device and initialised by replay has the eager build's weights,
bit for bit; what cannot be replayed says why. Sharded by FSDP2 across 2 ranks: in
test_two_ranks.py."""

import weakref

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from hanlm import model as model_lib
from hanlm import model_init
from hanlm.train import parallel, precision, pretrain
from hanlm.train.build import Placement

SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 100,
}

CONFIGS = {
    "tiny preset, tied": lambda: model_lib.model_config("tiny", vocab_size=128, seq_len=32),
    # a padding row (zeroed through a view), an untied head, biases
    "llama, padded, untied, biased": lambda: LlamaConfig(
        **SMALL, pad_token_id=3, tie_word_embeddings=False, attention_bias=True, mlp_bias=True
    ),
    "qwen2": lambda: Qwen2Config(**SMALL),
}


def assert_same_weights(got: torch.nn.Module, expected: torch.nn.Module) -> None:
    got_state, expected_state = got.state_dict(), expected.state_dict()
    assert got_state.keys() == expected_state.keys()
    for name, tensor in expected_state.items():
        assert torch.equal(got_state[name], tensor), name
    got_buffers = dict(got.named_buffers())
    for name, buffer in expected.named_buffers():  # RoPE frequencies: not in the state dict
        assert torch.equal(got_buffers[name], buffer), name


@pytest.mark.parametrize("which", CONFIGS)
@pytest.mark.parametrize("seed", [0, 7])
def test_meta_build_replays_the_eager_weights(which, seed):
    config = CONFIGS[which]()
    eager = model_lib.build_model(config, seed=seed)
    model, init = model_init.build_on_meta(config)
    assert init.unsupported is None
    assert all(p.is_meta for p in model.parameters())
    generator_before = torch.random.get_rng_state()
    model_init.materialise(model, init, seed=seed, device="cpu")
    assert torch.equal(torch.random.get_rng_state(), generator_before)  # the caller's RNG kept
    assert_same_weights(model, eager)
    tied = config.tie_word_embeddings
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.training


def test_other_seeds_give_other_weights():
    config = CONFIGS["tiny preset, tied"]()
    model, init = model_init.build_on_meta(config)
    model_init.materialise(model, init, seed=1, device="cpu")
    eager = model_lib.build_model(config, seed=2)
    assert not torch.equal(model.model.embed_tokens.weight, eager.model.embed_tokens.weight)


def test_replay_frees_each_full_value_before_the_next():
    """What `store` gets is dropped once it returns: a rank never holds two full parameters
    from the replay (one, plus its shards)."""
    model, init = model_init.build_on_meta(CONFIGS["llama, padded, untied, biased"]())
    handed: list[weakref.ref] = []
    names: list[str] = []

    def store(name: str, value: torch.Tensor) -> None:
        assert all(ref() is None for ref in handed), f"a value before {name} is still alive"
        handed.append(weakref.ref(value))
        names.append(name)

    init.replay(0, "cpu", store)
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())


class ArangeParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.arange(4.0))


class OwnGenerator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(4, 4))
        torch.nn.init.normal_(self.weight, generator=torch.Generator().manual_seed(1))


class RandnCopy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(4, 4))
        with torch.no_grad():
            self.weight.copy_(torch.randn(4, 4))


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (ArangeParameter, "parameter scale gets its value otherwise than by an init op"),
        (OwnGenerator, "weight is written by aten.normal_.default with tensor or generator"),
        (RandnCopy, "draws a new random tensor"),
        (lambda: torch.nn.BatchNorm1d(4), "has buffers but no transformers _init_weights"),
    ],
)
def test_what_cannot_be_replayed_says_why(module, reason):
    _, init = model_init.record_build(module)
    assert init.unsupported is not None and reason in init.unsupported
    with pytest.raises(RuntimeError, match="cannot be replayed"):
        init.replay(0, "cpu", lambda name, value: None)


def test_plain_modules_replay_their_default_init():
    def build():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Embedding(10, 8, padding_idx=2))

    model, init = model_init.record_build(build)
    assert init.unsupported is None
    model_init.materialise(model, init, seed=4, device="cpu")
    torch.manual_seed(4)
    assert_same_weights(model, build())


def test_fsdp_falls_back_to_the_eager_build_when_replay_is_impossible(monkeypatch, capsys):
    config = CONFIGS["tiny preset, tied"]()
    monkeypatch.setattr(
        model_init,
        "build_on_meta",
        lambda config: (None, model_init.MetaInit(unsupported="a reason")),
    )
    d = parallel.Dist(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    at = Placement(d, "fsdp", precision.resolve("fp32", d.device))
    model, meta_init = pretrain._new_model(config, 5, at)
    assert meta_init is None
    assert_same_weights(model, model_lib.build_model(config, seed=5))
    assert "a reason" in capsys.readouterr().err.replace("\n", " ")
