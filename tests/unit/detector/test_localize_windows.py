"""The window family of the passage search: fixed by m alone, dyadic, 50 % overlap, covering."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmark.detector.localize import window_family
from wmark.errors import InputError


@pytest.mark.parametrize("m", [0, 1, 32, 33, 100, 1000, 4097])
def test_windows_are_dyadic_half_overlapping_and_inside(m):
    w = 32
    starts, ends = window_family(m, w)
    lengths = ends - starts
    assert np.all(starts >= 0) and np.all(ends <= m)
    assert set(lengths.tolist()) == {w << k for k in range(20) if (w << k) < m}
    for length in set(lengths.tolist()):
        s = starts[lengths == length]
        assert np.all(s % (length // 2) == 0)  # starts every half length
        assert s[0] == 0 and s[-1] + length > m - length // 2  # the grid reaches the end
    assert len(starts) <= 4 * m / w  # ~2m/L per length, summed over doubling lengths


def test_the_family_depends_only_on_m_and_the_shortest_window():
    a = window_family(777, 16)
    b = window_family(777, 16)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(window_family(777, 32)[0]) < len(a[0])


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(min_value=50, max_value=6000),
    frac_start=st.floats(min_value=0.0, max_value=1.0),
    frac_len=st.floats(min_value=0.0, max_value=1.0),
)
def test_every_passage_of_one_and_a_half_windows_holds_a_third_of_itself(m, frac_start, frac_len):
    w = 32
    p_min = (3 * w) // 2
    length = p_min + int(frac_len * (m - p_min))
    start = int(frac_start * (m - length))
    starts, ends = window_family(m, w)
    inside = (starts >= start) & (ends <= start + length)
    assert inside.any(), (m, start, length)
    assert (ends - starts)[inside].max() * 3 > length


@pytest.mark.parametrize("bad", [0, 1, 31, -2])
def test_the_shortest_window_must_be_even_and_at_least_two(bad):
    with pytest.raises(InputError):
        window_family(100, bad)
