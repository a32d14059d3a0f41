"""Repetition metrics on hand-computed cases, and the with/without task on a tiny model."""

import pytest

from hanlm.evals.tasks import repetition as rep


def test_seq_rep_n_hand_cases():
    assert rep.seq_rep_n([1, 2, 3, 4, 5], 2) == 0.0  # 4 bigrams, all distinct
    # a a a a: 3 bigrams, 1 distinct -> 1 - 1/3
    assert rep.seq_rep_n(["a"] * 4, 2) == pytest.approx(2 / 3)
    # 1 2 3 1 2 3 1 2: 4-grams (1231) (2312) (3123) (1231) (2312): 3 distinct of 5
    assert rep.seq_rep_n([1, 2, 3, 1, 2, 3, 1, 2], 4) == pytest.approx(1 - 3 / 5)
    assert rep.seq_rep_n([1, 2, 3], 4) is None  # no 4-gram at all


def test_mean_seq_rep_skips_short_sequences():
    sequences = [[1, 1, 1, 1, 1], [1, 2, 3, 4, 5], [7]]
    # 4-grams: first 2 of 1 distinct -> 0.5; second 2 of 2 -> 0; third has none
    assert rep.mean_seq_rep(sequences, 4) == pytest.approx(0.25)
    assert rep.mean_seq_rep([[1]], 4) is None


def test_rep_l_hand_cases():
    # positions 1..4 of a b a c b: a? no; b? no ... with window 2:
    # t=1 'b' in [a] no; t=2 'a' in [a b] yes; t=3 'c' in [b a] no; t=4 'b' in [a c] no
    tokens = list("abacb")
    assert rep.rep_l_counts(tokens, 2) == (1, 4)
    # window 16 sees everything before: t=2 a yes, t=4 b yes
    assert rep.rep_l_counts(tokens, 16) == (2, 4)
    assert rep.rep_l([tokens, list("xx")], 16) == pytest.approx((2 + 1) / (4 + 1))
    assert rep.rep_l([[5]], 16) is None


def test_distinct_n_is_over_the_whole_set():
    # unigrams 1 2 1 | 1 3: 5 in all, distinct {1,2,3}
    assert rep.distinct_n([[1, 2, 1], [1, 3]], 1) == pytest.approx(3 / 5)
    # bigrams (1,2) (2,1) | (1,3): all distinct
    assert rep.distinct_n([[1, 2, 1], [1, 3]], 2) == 1.0
    assert rep.distinct_n([[1]], 2) is None


def test_metrics_of_a_loop_and_of_fresh_text():
    loop = rep.metrics([[4, 5] * 20])
    fresh = rep.metrics([list(range(40))])
    assert loop["seq_rep_4"] > 0.9 and fresh["seq_rep_4"] == 0.0
    assert loop["rep_16"] > 0.9 and fresh["rep_16"] == 0.0
    assert loop["distinct_1"] == pytest.approx(2 / 40) and fresh["distinct_1"] == 1.0
    assert fresh["mean_length"] == 40


def test_markdown_table_has_both_columns():
    result = {
        "without": {"seq_rep_4": 0.8, "distinct_1": None},
        "with": {"seq_rep_4": 0.1, "distinct_1": 0.5},
        "delta": {"seq_rep_4": -0.7, "distinct_1": None},
    }
    table = rep.markdown(result)
    assert "| seq_rep_4 | 0.800 | 0.100 | -0.700 |" in table
    assert "| distinct_1 | – | 0.500 | – |" in table
