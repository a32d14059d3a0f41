"""The training mix (hanlm.data.mixture): shares, epochs, interleaving and the mixes refused."""

import math

import numpy as np
import pytest

from hanlm.config import CorpusSourceSection, load_config
from hanlm.data import mixture
from hanlm.errors import UserError

SEQ = 64


def sources(*specs) -> list[CorpusSourceSection]:
    return [CorpusSourceSection(name=n, inputs=["x"], **kw) for n, kw in specs]


THREE = sources(
    ("big", {"weight": 0.6}),
    ("mid", {"weight": 0.3}),
    ("small", {"weight": 0.1, "max_epochs": 50}),
)
WINDOWS = {"big": 200_000, "mid": 3_000, "small": 97}  # very different sizes


def ids_of(windows: dict[str, int]) -> list[np.ndarray]:
    """Each source's sample ids as the loader numbers them: file after file."""
    out, start = [], 0
    for n in windows.values():
        out.append(np.arange(start, start + n))
        start += n
    return out


def source_of(order: np.ndarray, windows: dict[str, int]) -> np.ndarray:
    return np.searchsorted(np.cumsum(list(windows.values())), order, side="right")


def test_shares_are_the_weights_within_half_a_percent_at_every_scale():
    for budget in (1_000, 4_321, 9_000):
        mix = mixture.plan(THREE, WINDOWS, budget, SEQ)
        assert mix.total == budget
        order = mix.order(ids_of(WINDOWS), seed=3, epoch=0, shuffle=True)
        assert len(order) == budget
        realised = np.bincount(source_of(order, WINDOWS), minlength=3) / budget
        assert np.abs(realised - [0.6, 0.3, 0.1]).max() < 0.005, realised
        # and in every prefix the order is at most one window off each share
        counts = np.zeros(3)
        for position, s in enumerate(source_of(order, WINDOWS)[:2000], start=1):
            counts[s] += 1
            assert np.abs(counts - position * np.array([0.6, 0.3, 0.1])).max() <= 1.0 + 1e-9


def test_a_small_source_is_repeated_evenly_and_a_big_one_sampled_without_repeats():
    mix = mixture.plan(THREE, WINDOWS, 9_000, SEQ)
    order = mix.order(ids_of(WINDOWS), seed=0, epoch=0, shuffle=True)
    small = order[source_of(order, WINDOWS) == 2]
    times = np.bincount(small - 203_000, minlength=97)  # each small window's draws
    assert mix.sources[2].epochs == pytest.approx(900 / 97)
    assert set(times.tolist()) <= {math.floor(900 / 97), math.ceil(900 / 97)}
    big = order[source_of(order, WINDOWS) == 0]
    assert len(np.unique(big)) == len(big) == 5_400  # epochs < 1: a seeded subset, no repeats


def test_no_source_waits_longer_than_its_stated_window():
    """A source with share w appears in every ceil(1 / w) + (number of sources) positions."""
    mix = mixture.plan(THREE, WINDOWS, 9_000, SEQ)
    which = source_of(mix.order(ids_of(WINDOWS), seed=1, epoch=0, shuffle=True), WINDOWS)
    for s, weight in enumerate((0.6, 0.3, 0.1)):
        at = np.flatnonzero(which == s)
        gaps = np.diff(np.concatenate([[-1], at, [len(which)]]))
        assert gaps.max() <= math.ceil(1 / weight) + 3


def test_the_order_is_seeded_per_epoch_and_the_same_without_shuffle_each_time():
    mix = mixture.plan(THREE, WINDOWS, 3_000, SEQ)
    ids = ids_of(WINDOWS)
    a, b = mix.order(ids, 0, 0, True), mix.order(ids, 0, 0, True)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, mix.order(ids, 0, 1, True))
    assert not np.array_equal(a, mix.order(ids, 1, 0, True))
    plain = mix.order(ids, 0, 0, False)
    assert np.array_equal(plain, mix.order(ids, 5, 3, False))
    assert np.array_equal(
        np.bincount(source_of(plain, WINDOWS)), np.bincount(source_of(a, WINDOWS))
    )


def test_token_counts_come_first_and_weights_share_the_rest():
    mixed = sources(("books", {"tokens": 640 * SEQ}), ("web", {"weight": 1.0}))
    mix = mixture.plan(mixed, {"books": 1000, "web": 50_000}, 4_000, SEQ)
    assert [s.drawn for s in mix.sources] == [640, 3_360]
    rows = {r["source"]: r for r in mix.rows()}
    assert rows["books"]["tokens"] == 640 * SEQ and rows["web"]["share"] == 0.84


def test_a_share_past_max_epochs_is_refused_naming_the_source_and_what_it_can_give():
    with pytest.raises(UserError, match="cannot be met within max_epochs") as caught:
        mixture.plan(THREE, {**WINDOWS, "small": 10}, 9_000, SEQ)
    err = caught.value
    assert "'small'" in err.what and "90.00 epochs" in err.what and "max_epochs 50" in err.what
    assert "'mid'" not in err.what and "max_epochs" in err.fix


def test_more_than_four_epochs_is_flagged():
    mix = mixture.plan(THREE, WINDOWS, 9_000, SEQ)
    assert [s.name for s in mix.over_warning()] == ["small"]


def test_a_source_without_windows_and_token_counts_over_the_budget_are_refused():
    with pytest.raises(UserError, match="small have no training"):
        mixture.plan(THREE, {"big": 10, "mid": 10}, 100, SEQ)
    too_many = sources(("a", {"tokens": 200 * SEQ}), ("b", {"weight": 1.0}))
    with pytest.raises(UserError, match="exceed the training"):
        mixture.plan(too_many, {"a": 500, "b": 500}, 100, SEQ)


MIX = """
[[corpus.sources]]
name = "web"
inputs = ["a/*.jsonl"]
{web}
[[corpus.sources]]
name = "{second}"
inputs = ["b/*.jsonl"]
{wiki}
"""


@pytest.mark.parametrize(
    ("web", "wiki", "second", "extra", "message"),
    [
        ("weight = 0.7", "weight = 0.2", "wiki", "", "the source weights sum to 0.9"),
        ("weight = 0.7", "", "wiki", "", "wiki have no weight or tokens while others do"),
        ("weight = 0.5", "weight = 0.5\ntokens = 10", "wiki", "", "both a weight and a token"),
        ("weight = 0.5", "weight = 0.5", "web", "", "names web more than once"),
        ("weight = 0.5", "weight = 0.5", "wi ki", "", "must be 1-64 letters"),
        ("weight = 0.5", "weight = 0.5", "wiki", "inputs = ['x']", "corpus.inputs and"),
        ("weight = 1.5", "weight = 0.5", "wiki", "", "less than or equal to 1"),
    ],
)
def test_bad_mixtures_in_the_recipe_are_clear_errors(tmp_path, web, wiki, second, extra, message):
    recipe = tmp_path / "mix.toml"
    recipe.write_text(f"[corpus]\n{extra}\n" + MIX.format(web=web, wiki=wiki, second=second))
    with pytest.raises(UserError) as err:
        load_config(recipe)
    assert message in str(err.value)


def test_a_flat_inputs_list_is_one_unmixed_source_and_sources_survive_the_saved_config(tmp_path):
    from hanlm.config import config_to_toml

    flat = load_config(values={"corpus.inputs": ["x.jsonl"]}).corpus
    assert [(s.name, s.inputs, s.mixed) for s in flat.source_list()] == [
        ("corpus", ["x.jsonl"], False)
    ]
    recipe = tmp_path / "mix.toml"
    recipe.write_text(MIX.format(web="weight = 1.0", wiki="tokens = 1000", second="wiki"))
    cfg = load_config(recipe)
    assert cfg.corpus.is_mixture and cfg.corpus.all_inputs() == ["a/*.jsonl", "b/*.jsonl"]
    saved = tmp_path / "saved.toml"
    saved.write_text(config_to_toml(cfg))
    assert load_config(saved).corpus == cfg.corpus


def test_the_plan_previews_the_mix_and_says_how_far_a_capped_source_falls_short():
    rows = mixture.preview(THREE, {"big": 1e9, "mid": 1e6, "small": None}, 10_000_000)
    by = {r["source"]: r for r in rows}
    assert by["big"]["tokens"] == 6_000_000 and by["big"]["epochs"] == 0.006
    assert by["mid"]["epochs"] == 3.0 and by["mid"]["short_of_budget"] == 0  # 4 allowed
    assert by["small"]["available"] is None and by["small"]["epochs"] is None
    capped = mixture.preview(THREE, {"big": 1e9, "mid": 5e5, "small": 1e6}, 10_000_000)
    assert {r["source"]: r["short_of_budget"] for r in capped}["mid"] == 0.1  # 3M asked, 2M can


def test_hanlm_plan_prints_the_mix_of_a_recipe_with_sources(tmp_path, cli):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"text": "가나다라마바사"}\n' * 2000)
    recipe = tmp_path / "mix.toml"
    recipe.write_text(
        "[pretrain]\nmax_tokens = 4_000_000\n"
        + MIX.replace("a/*.jsonl", str(tmp_path / "a.jsonl"))
        .replace("b/*.jsonl", str(tmp_path / "b.jsonl"))
        .format(web="weight = 0.9", wiki="weight = 0.1", second="wiki")
    )
    result = cli("plan", "--config", recipe)
    assert result.code == 0, result.err
    err = " ".join(result.err.split())
    assert "training mix" in err and "90.0%" in err and "capped at max_epochs" in err


def test_inputs_on_the_command_line_replace_the_recipes_sources(tmp_path):
    recipe = tmp_path / "mix.toml"
    recipe.write_text(MIX.format(web="weight = 0.5", wiki="weight = 0.5", second="wiki"))
    cfg = load_config(recipe, values={"corpus.inputs": ["mine/*.jsonl"]})
    assert cfg.corpus.sources == [] and cfg.corpus.all_inputs() == ["mine/*.jsonl"]
    assert load_config("demo").corpus.is_mixture  # the demo recipe's wiki and web
    assert not load_config("demo", values={"corpus.inputs": ["x.txt"]}).corpus.is_mixture


def test_a_demo_source_that_does_not_exist_is_refused():
    from hanlm.data import readers

    assert readers.expand_inputs(["demo:wiki", "demo"]) == ["demo:wiki", "demo"]
    with pytest.raises(UserError, match="names no source of the demo world") as caught:
        readers.expand_inputs(["demo:books"])
    assert "demo:wiki" in caught.value.fix and "demo:web" in caught.value.fix
