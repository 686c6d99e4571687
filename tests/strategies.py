"""Shared hypothesis strategies for probability vectors."""

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays


@st.composite
def distributions(draw, size, min_zero_frac=0.0, allow_zeros=True):
    """A probability vector of length ``size``: random weights, some zeros, normalised."""
    w = draw(arrays(np.float64, size, elements=st.floats(0.0, 1.0, allow_nan=False)))
    if allow_zeros:
        mask = draw(arrays(np.bool_, size))
        w = np.where(mask & (np.arange(size) > 0), 0.0, w)
    if w.sum() <= 1e-12:
        w = np.zeros(size)
        w[draw(st.integers(0, size - 1))] = 1.0
    return w / w.sum()


@st.composite
def pairs(draw, min_size=1, max_size=6, allow_zeros=True):
    V = draw(st.integers(min_size, max_size))
    return draw(distributions(V, allow_zeros=allow_zeros)), draw(
        distributions(V, allow_zeros=allow_zeros)
    )
