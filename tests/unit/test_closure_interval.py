"""The closure rate's 95% Wilson interval and the loop count of the closure check."""

import pytest

from hanlm.chat.closure import loops, rate_interval


@pytest.mark.parametrize(
    ("closed", "low", "high"),
    [(0, 0.0, 0.0713), (45, 0.7864, 0.9565), (50, 0.9287, 1.0), (25, 0.3664, 0.6336)],
)
def test_wilson_interval_of_50_answers(closed, low, high):
    got = rate_interval(closed, 50)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_the_rate_is_always_inside_its_interval():
    for total in (1, 7, 50, 1000):
        for closed in range(0, total + 1, max(1, total // 50)):
            low, high = rate_interval(closed, total)
            assert 0 <= low <= closed / total <= high <= 1
    with pytest.raises(ValueError):
        rate_interval(0, 0)


def test_an_answer_loops_when_half_its_4_grams_repeat():
    assert loops([7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    assert not loops(list(range(40)))
    assert not loops([1, 2, 3])  # no 4-gram
