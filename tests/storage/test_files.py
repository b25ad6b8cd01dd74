"""storage.files: locations joined as their kind joins them, resolved once or per call alike."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from shardio.storage.files import join, joiner

_ROOTS = st.sampled_from(
    ["", "/data", "/data/", "data", "file:///data", "http://host/data", "http://host/data/", "s3://bucket"]
)
_PARTS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=8
)


@given(_ROOTS, st.lists(_PARTS, min_size=1, max_size=3).map("/".join), st.booleans())
def test_a_joiner_joins_as_join_does(root: str, name: str, absolute: bool) -> None:
    """An index resolves its root's kind once (``joiner``) and joins every shard name with it: the same paths
    and URLs as ``join`` per name, for names with any characters, absolute ones too (``allow_outside_root``),
    also after pickling (an index sent to a spawned worker)."""
    name = "/" + name if absolute else name
    joined = joiner(root)
    assert joined(name) == join(root, name)
    assert pickle.loads(pickle.dumps(joined))(name) == join(root, name)
