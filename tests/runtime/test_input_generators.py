"""Named input generators shared by every model's example inputs, bench inputs and pipeline:
RoPE tables over a span of positions and causal masks that hide placeholder cache rows."""

from __future__ import annotations

import numpy as np
import pytest

from ncnnport.runtime import masks
from ncnnport.runtime.rope import cos_sin, inv_freq, span


@pytest.mark.parametrize("start, length", [(0, 5), (7, 1), (99, 3)])
def test_span_is_the_rope_table_of_those_positions_with_the_batch_axis(start: int, length: int) -> None:
    cos, sin = span(start, length, 16, 10000.0)
    ref_cos, ref_sin = cos_sin(np.arange(start, start + length), inv_freq(16, 10000.0))
    assert cos.shape == sin.shape == (1, length, 16)
    assert np.array_equal(cos[0], ref_cos) and np.array_equal(sin[0], ref_sin)   # bit for bit


def test_causal_mask_hides_the_named_key_rows_only() -> None:
    plain = masks.causal(3, 2)
    hidden = masks.causal(3, 2, hidden=(0,))
    assert hidden.shape == plain.shape == (1, 3, 5)
    assert (hidden[:, :, 0] == masks.MASKED).all()
    assert np.array_equal(hidden[:, :, 1:], plain[:, :, 1:])
    assert np.array_equal(masks.causal(3, 2, hidden=()), plain)
    # query 0 at position 2 sees keys 1..2 once row 0 is hidden
    assert list(hidden[0, 0] == 0) == [False, True, True, False, False]
