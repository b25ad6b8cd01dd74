"""Validators: which version of a remote shard a process reads, so that one replaced mid-run is refused.

The first time a process reads a remote shard (its size check, or the first answer to a range of it), the
object's validator is recorded: on S3 its ETag (from ``HeadObject``, or the ``GetObject`` answer); over HTTP
its ``ETag`` header, else its ``Last-Modified``. Every later read of that shard sends it as a condition (S3:
``IfMatch``; HTTP: ``If-Match`` for a strong ETag, else ``If-Unmodified-Since``), and every answer that
carries a validator is compared with it (for servers that ignore conditions). A ``412 Precondition Failed``,
or a validator that differs, is a :class:`~shardio.errors.ShardChanged`, never retried: reading on would mix
two versions of the shard's audio. No request is added: the validator comes from answers already asked for.

A weak ETag (``W/"..."``) never satisfies ``If-Match`` (RFC 9110 compares strongly), so it is only compared
(weakly) with later answers' ETags, and the condition sent is ``If-Unmodified-Since`` where the server gave a
``Last-Modified`` (whole seconds: a replacement within the second of the first read is not seen by it). A
server that sends neither is read as before (the index's size is still checked). Other protocols (``gs://``)
are read as before.

Validators are learned per process (each DataLoader worker on its first read of a shard) and kept across
``fork`` and pickling, so workers inherit what their parent had learned: no process ever reads two versions of
one shard. A process whose first read of a shard comes after a same-size replacement reads the new version
whole; the node cache (checked against the index's SHA-256) and ``shardio verify`` catch that one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardChanged, shown

__all__ = ["Pin", "Validator", "Validators", "from_headers", "from_info"]


@dataclass(frozen=True)
class Validator:
    """What identifies one version of a remote object: its ETag, and (HTTP) its Last-Modified date."""

    etag: str | None = None
    modified: str | None = None

    def conditions(self) -> dict[str, str]:
        """HTTP request headers that make a server refuse (412) an object that is no longer this version."""
        if self.etag and not self.etag.startswith("W/"):
            return {"If-Match": self.etag}
        if self.modified:
            return {"If-Unmodified-Since": self.modified}
        return {}

    def differs(self, other: Validator) -> bool:
        """Whether ``other`` names another version: ETags compared where both have one (weakly: ``W/"x"`` and
        ``"x"`` agree), else Last-Modified dates; nothing to compare is no difference."""
        if self.etag and other.etag:
            return self.etag.removeprefix("W/") != other.etag.removeprefix("W/")
        if self.modified and other.modified:
            return self.modified != other.modified
        return False

    def __str__(self) -> str:
        return f"ETag {shown(self.etag)}" if self.etag else f"Last-Modified {shown(self.modified)}"


def from_headers(headers: Mapping[str, str]) -> Validator | None:
    """The validator of an HTTP answer with ``headers`` (None: it carries none)."""
    etag, modified = headers.get("ETag") or None, headers.get("Last-Modified") or None
    return Validator(etag, modified) if etag or modified else None


def from_info(info: Mapping[str, Any], protocol: str) -> Validator | None:
    """The validator in fsspec ``info`` of an object read over ``protocol`` ("http" or "s3"; None for others,
    whose reads cannot send it)."""
    if protocol == "http":
        return from_headers({name: str(info[name]) for name in ("ETag", "Last-Modified") if info.get(name)})
    if protocol == "s3" and info.get("ETag"):
        return Validator(etag=str(info["ETag"]))
    return None


@dataclass
class Validators:
    """One process's validators of remote shards (by shard number), and the shards found changed. Safe to use
    from read-ahead threads (single dict operations); kept across ``fork`` and pickling."""

    seen: dict[int, Validator] = field(default_factory=dict)
    changed: dict[int, str] = field(default_factory=dict)
    """Shard number -> why it was found changed (later reads of it fail without a request)."""

    def pin(self, shard: int) -> Pin:
        """What reads of shard ``shard`` send and check."""
        return Pin(self, shard)

    def refuse_changed(self, shard: int, where: str) -> None:
        """Raise :class:`ShardChanged` (naming ``where``) if shard ``shard`` was found changed."""
        reason = self.changed.get(shard)
        if reason is not None:
            raise ShardChanged(f"{where}: {reason}")


@dataclass(frozen=True)
class Pin:
    """One remote shard's validator in one process: what a read of it sends, and checks answers against."""

    store: Validators
    shard: int

    @property
    def expected(self) -> Validator | None:
        """The validator recorded at this process's first read of the shard (None: not yet, or none sent)."""
        return self.store.seen.get(self.shard)

    def check(self, found: Validator | None) -> None:
        """Record ``found`` (an answer's validator) if none is yet; raise :class:`ShardChanged` if it names
        another version than the one recorded."""
        if found is None:
            return
        known = self.store.seen.setdefault(self.shard, found)
        if known is not found and known.differs(found):
            raise self.changed(f"{known} when this process first read it, {found} now")

    def refused(self, condition: str) -> ShardChanged:
        """The error for a ``412 Precondition Failed`` answer to a read sent with ``condition``."""
        return self.changed(f"the server answered 412 Precondition Failed to {condition}")

    def changed(self, how: str) -> ShardChanged:
        """The :class:`ShardChanged` error saying ``how`` the shard was seen to change (and recorded, so
        later reads of it fail at once)."""
        reason = (
            f"the remote shard changed since this process first read it ({how}): it was replaced "
            "while the run reads it (or replicas behind one address serve it with different "
            "validators), and reading on would mix two versions of its audio; keep shards unchanged "
            "during a run, or re-run 'shardio index' (or re-pack) and start again"
        )
        self.store.changed.setdefault(self.shard, reason)
        return ShardChanged(reason)
