"""service/http/arrays.py: compact arrays decode to the weights within their precision."""

from __future__ import annotations

import numpy as np

from service.http import arrays


def test_arrays_round_trip() -> None:
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(7), size=(2, 3, 5)).round(6)
    np.testing.assert_array_equal(arrays.encode(w, "json"), w)
    assert arrays.encode(w[:, :, ::2], "json").flags.c_contiguous
    for encoding, atol in (("float16", 5e-4), ("uint8", 0.5 / 255)):
        got = arrays.decode(arrays.encode(w, encoding))
        assert got.shape == w.shape
        np.testing.assert_allclose(got, w, atol=atol)
