"""The Student-t interval of bench.common.stats against published t-table quantiles."""

from __future__ import annotations

import math

import pytest

from bench.common.stats import t_central_probability, t_interval, t_quantile

# Two-sided 95 % quantiles of Student's t (any printed t table), by degrees of freedom.
T_TABLE_975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 10: 2.2281, 30: 2.0423}


@pytest.mark.parametrize(("df", "expected"), sorted(T_TABLE_975.items()))
def test_the_quantile_matches_the_t_table(df: int, expected: float) -> None:
    assert t_quantile(0.95, df) == pytest.approx(expected, abs=5e-5)


def test_the_closed_form_matches_known_probabilities() -> None:
    # df = 1 is the Cauchy distribution: P(|T| ≤ 1) = 1/2; df = 2: P(|T| ≤ t) = t/√(t² + 2).
    assert t_central_probability(1.0, 1) == pytest.approx(0.5)
    assert t_central_probability(3.0, 2) == pytest.approx(3 / math.sqrt(11))
    assert t_central_probability(0.0, 5) == 0.0
    with pytest.raises(ValueError, match="positive integer"):
        t_central_probability(1.0, 0)


def test_the_interval_is_mean_plus_minus_t_sd_over_root_n() -> None:
    values = [0.90, 0.95, 1.00, 0.97, 0.93]
    mean, low, high = t_interval(values)
    sd = math.sqrt(sum((v - 0.95) ** 2 for v in values) / 4)
    assert mean == pytest.approx(0.95)
    assert (low, high) == pytest.approx(
        (0.95 - 2.7764 * sd / math.sqrt(5), 0.95 + 2.7764 * sd / math.sqrt(5)), abs=1e-6
    )
    assert t_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_one_value_has_no_interval() -> None:
    mean, low, high = t_interval([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="no values"):
        t_interval([])
