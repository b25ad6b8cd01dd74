"""SampleMembers: the part of :class:`~shardio.reading.reader.Reader` that splits a sample's tar bytes into
its members, ``{ext: bytes}``.

Every member must carry the key the index gives the sample: a shard re-written with other samples, or an
offset that lands on another sample, fails here with :class:`~shardio.errors.FormatError` rather than
yielding one sample's audio under another's key. Each tar header's checksum is checked as the members are
parsed (:func:`~shardio.shards.tarformat.split_sample`). A sample whose shard came from the node cache and
fails these checks is read once more from a fresh copy (the reader's ``_refetch``): the cached file may have
been damaged on disk.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import FormatError
from ..shards.index import Index
from ..shards.tarformat import split_sample

__all__ = ["SampleMembers"]


class SampleMembers:
    """A sample's members by extension, for a reader with these attributes."""

    index: Index
    where: Callable[..., str]
    sample_bytes: Callable[..., memoryview]
    _sample_bytes: Callable[[int, str], memoryview]
    _refetch: Callable[[int, str], bool]

    def members(self, sample: int, where: str | None = None) -> dict[str, memoryview]:
        """Sample number ``sample`` as ``{ext: bytes}``, checking each member belongs to its key (``where``,
        when the caller already has it, names the sample in errors)."""
        where = where or self.where(sample)
        return self.split_members(sample, self.sample_bytes(sample, where), where)

    def split_members(
        self, sample: int, data: memoryview, where: str, key: str | None = None
    ) -> dict[str, memoryview]:
        """``data``, the tar bytes of sample number ``sample`` (:meth:`sample_bytes`), as ``{ext: bytes}``,
        checking each member belongs to its key (a damaged shard from the node cache is fetched again).
        ``key``: the sample's own key, when the caller has it."""
        try:
            return self._split(sample, data, where, key)
        except FormatError:
            if not self._refetch(sample, where):
                raise
            return self._split(sample, self._sample_bytes(sample, where), where, key)

    def _split(self, sample: int, data: memoryview, where: str, key: str | None) -> dict[str, memoryview]:
        if key is None or self.index.has_metadata:  # metadata may name another sample's members
            key = self.index.member_key(sample)
        return split_sample(data, key, where)
