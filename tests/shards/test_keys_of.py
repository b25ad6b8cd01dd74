"""Keys of a batch at once (``Keys.keys_of``): each sample's key, in order, from a plain or a chained key
table; a damaged span or a key that is not UTF-8 is a ``FormatError``, as it is one key at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardio.errors import FormatError
from shardio.shards.keys import ChainedKeys, Keys


@given(keys=st.lists(st.text(max_size=8), min_size=1, max_size=20), data=st.data())
def test_the_keys_of_a_batch_are_each_samples_key(keys: list[str], data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=12))
    table = Keys.of(keys)
    assert table.keys_of(np.array(ids, dtype=np.int64)) == [keys[i] for i in ids]


@given(
    parts=st.lists(st.lists(st.text(max_size=5), min_size=1, max_size=6), min_size=1, max_size=4),
    data=st.data(),
)
def test_the_keys_of_a_batch_of_a_chain_are_each_samples_key(
    parts: list[list[str]], data: st.DataObject
) -> None:
    every = [key for part in parts for key in part]
    ids = data.draw(st.lists(st.integers(0, len(every) - 1), max_size=12))
    chain = ChainedKeys([Keys.of(part) for part in parts])
    assert chain.keys_of(np.array(ids, dtype=np.int64)) == [every[i] for i in ids]


def test_a_damaged_span_or_a_key_that_is_not_utf8_is_a_format_error() -> None:
    beyond = Keys(b"abcd", np.array([2, 9], dtype=np.uint64), "idx")
    assert beyond.keys_of(np.array([0])) == ["ab"]
    with pytest.raises(FormatError, match="key 1 spans bytes 2 to 9"):
        beyond.keys_of(np.array([0, 1]))
    broken = Keys(b"ab\xff", np.array([2, 3], dtype=np.uint64), "idx")
    with pytest.raises(FormatError, match="key 1 is not valid UTF-8"):
        broken.keys_of(np.array([1, 0]))
