"""ShardWriter: writes samples as ``{key}.{ext}`` tar members into rolling ``.tar`` / ``.tar.zst`` shards.

A ``.tar.zst`` shard is a sequence of independent zstd frames, each holding the tar bytes of whole samples
(consecutive samples are grouped until a frame reaches ``frame_bytes``), and a last frame with the tar's
end-of-archive blocks. Concatenated frames are one valid zstd stream, so ``zstd -dc | tar x`` reads the
shard, while the index can seek straight to any sample's frame.

Everything is deterministic (fixed mtime, owner and mode; the caller's order), and atomic: a shard is
written under a temporary name and renamed when complete; the index is written last, by :meth:`close`. Until
then the directory's journal (:mod:`shardio.shards.journal`) names each finished shard with its size and
SHA-256, so that the next writer into a directory a run left unfinished replaces those files and no other.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from types import TracebackType
from typing import BinaryIO

import zstandard

from ..checks.options import integer
from ..errors import InputError, InputProblem, OptionError
from ..storage.dirlock import DirectoryLock
from ..storage.files import check_output_file, open_output
from .builder import IndexBuilder
from .index import Index, ShardInfo
from .journal import partial_name
from .names import key_problem
from .outputdir import claim_directory, shard_files, writable_directory
from .tarencode import sample_parts
from .tarformat import END_OF_ARCHIVE

__all__ = ["ShardWriter", "DEFAULT_FRAME_BYTES"]

logger = logging.getLogger(__name__)

DEFAULT_FRAME_BYTES = 16 * 1024
"""Samples are grouped into one zstd frame until it holds this many tar bytes: a sample of over half a second
of 16 kHz PCM has a frame of its own, so reading it decompresses nothing else (with 64 KiB frames, shuffled
reads of 1-5 s speech decompressed 1.2x the bytes and ran 1.2x slower, for the same size); clips of a few KB
still share frames (FSDD: 16 KiB frames cost 1 point of size against 64 KiB, one frame per sample
2.5; README, Packing)."""


class ShardWriter:
    """Write samples into shards under a directory; use as a context manager, or call `close()`.

    Args:
        directory: Where the shards and `index.json` go: a local directory (made if missing; held under a lock
            while writing; a URL is refused).
        prefix: The shards' file name prefix (letters, digits, `_`, `-`; default `"shard"`).
        compression: `"none"` (the default: plain `.tar`, read by memory map) or `"zstd"` (`.tar.zst` in
            frames: smaller shards, a decompression per read).
        zstd_level: zstd's level with `compression="zstd"` (default 3; up to 22: slower to write, smaller).
        max_samples: Roll to a new shard after this many samples (default: no limit).
        max_bytes: Roll to a new shard at this many tar bytes, before compression (default: no limit); a
            single larger sample gets a shard of its own.
        frame_bytes: With zstd, samples share a frame until it holds this many tar bytes (default 16 KiB):
            larger frames compress better, and a read decompresses the whole frame.
        overwrite: Replace a dataset already in `directory` (default `False`: refused), and any shard-named
            files. Without it, only the files an interrupted writer's journal names with their size and
            SHA-256 are replaced (see `shardio.shards.journal`).

    Raises:
        OptionError: An option of the wrong type or out of range, a URL, or a directory that holds a dataset,
            shard files no interrupted writer's journal vouches for, or a journal shardio did not write
            (without `overwrite`).
        OutputError: A directory that cannot be written, or that another run is writing, or a journal that
            is not a regular file.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefix: str = "shard",
        compression: str = "none",
        zstd_level: int = 3,
        max_samples: int | None = None,
        max_bytes: int | None = None,
        frame_bytes: int = DEFAULT_FRAME_BYTES,
        overwrite: bool = False,
    ) -> None:
        if compression not in ("none", "zstd"):
            raise OptionError(f"compression must be 'none' or 'zstd', not {compression!r}")
        max_samples = None if max_samples is None else integer("max_samples", max_samples, 1)
        max_bytes = None if max_bytes is None else integer("max_bytes", max_bytes, 1)
        # zstd's fastest to its strongest level
        zstd_level = integer("zstd_level", zstd_level, -(1 << 17), 22)
        frame_bytes = integer("frame_bytes", frame_bytes, 1)
        if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]*", prefix):
            raise OptionError(f"shard prefix {prefix!r} must be letters, digits, '_' or '-'")
        self.compression = compression
        self._compressor = zstandard.ZstdCompressor(level=zstd_level, write_checksum=True)
        self.directory = os.fspath(directory)
        writable_directory(self.directory)
        self._lock = DirectoryLock(self.directory)
        try:
            self.prefix = prefix
            self._journal = claim_directory(self.directory, prefix, self._suffix, overwrite)
        except BaseException:
            self._lock.release()
            raise
        self._overwrite = overwrite
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.frame_bytes = frame_bytes
        self._builder = IndexBuilder(self.directory)
        self._keys: set[str] = set()
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._written = 0  # bytes in the current shard file
        self._tar_bytes = 0  # tar bytes (before compression) in the current shard
        self._samples = 0
        self._duration = 0.0
        self._group: list[tuple[dict[str, object], bytes]] = []
        self._group_bytes = 0
        self._closed = False

    @property
    def _suffix(self) -> str:
        return ".tar.zst" if self.compression == "zstd" else ".tar"

    def _name(self, number: int) -> str:
        return f"{self.prefix}-{number:06d}{self._suffix}"

    def _partial(self, name: str) -> str:
        return os.path.join(self.directory, partial_name(name))

    # -- writing ---------------------------------------------------------------------------------

    def write(
        self,
        key: str,
        members: dict[str, bytes],
        *,
        audio_ext: str,
        num_frames: int,
        sample_rate: int,
        channels: int,
    ) -> None:
        """Append one sample.

        Args:
            key: The sample's key (unique in the dataset).
            members: Each extension (`wav`, `json`, ...) to its bytes.
            audio_ext: The extension of the audio member.
            num_frames: The audio's frames, as the index records them.
            sample_rate: The audio's sample rate in Hz.
            channels: The audio's channels.

        Raises:
            InputError: A bad or duplicate key, or no member of `audio_ext`.
            OptionError: A writer already closed.
        """
        if self._closed:
            raise OptionError("this ShardWriter is closed")
        problem = key_problem(key)
        if problem is None and key in self._keys:
            problem = "duplicate key: another sample already has it"
        if problem is None and audio_ext not in members:
            problem = f"no '{audio_ext}' member among {sorted(members)}"
        if problem is not None:
            raise InputError([InputProblem(source=key, key=key, reason=problem)])
        self._keys.add(key)
        parts = sample_parts(key, members)
        size = sum(map(len, parts))
        rolls = self._samples > 0 and (
            (self.max_samples is not None and self._samples >= self.max_samples)
            or (self.max_bytes is not None and self._tar_bytes + size > self.max_bytes)
        )
        if rolls:
            self._finish_shard()
        if self._file is None:
            self._start_shard()
        info: dict[str, object] = dict(
            key=key, num_frames=num_frames, sample_rate=sample_rate, channels=channels, audio_ext=audio_ext
        )
        self._samples += 1
        self._tar_bytes += size
        self._duration += num_frames / max(sample_rate, 1)
        if self.compression == "none":
            self._record(info, frame_offset=self._written, frame_size=size, member_offset=0, member_size=size)
            for part in parts:  # no copy of the audio into one sample's bytes
                self._emit(part)
        else:
            self._group.append((info, b"".join(parts)))
            self._group_bytes += size
            if self._group_bytes >= self.frame_bytes:
                self._flush_group()

    def _record(self, info: dict[str, object], **where: int) -> None:
        self._builder.add_sample(shard=len(self._builder.shards), **where, **info)  # type: ignore[arg-type]

    def _emit(self, data: bytes) -> None:
        assert self._file is not None
        self._file.write(data)
        self._hash.update(data)
        self._written += len(data)

    def _flush_group(self) -> None:
        if not self._group:
            return
        frame = self._compressor.compress(b"".join(data for _, data in self._group))
        member_offset = 0
        for info, data in self._group:
            self._record(
                info,
                frame_offset=self._written,
                frame_size=len(frame),
                member_offset=member_offset,
                member_size=len(data),
            )
            member_offset += len(data)
        self._emit(frame)
        self._group.clear()
        self._group_bytes = 0

    def _start_shard(self) -> None:
        name = self._name(len(self._builder.shards))
        self._file = open_output(self._partial(name))
        self._hash = hashlib.sha256()
        self._written = self._tar_bytes = self._samples = 0
        self._duration = 0.0

    def _finish_shard(self) -> None:
        if self._file is None:
            return
        self._flush_group()
        tail = END_OF_ARCHIVE if self.compression == "none" else self._compressor.compress(END_OF_ARCHIVE)
        self._emit(tail)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        name = self._name(len(self._builder.shards))
        check_output_file(os.path.join(self.directory, name))
        # journaled before it takes its name: a file under a final name is one the journal vouches for
        self._journal.record(name, self._written, self._hash.hexdigest())
        os.replace(self._partial(name), os.path.join(self.directory, name))
        self._builder.add_shard(
            ShardInfo(
                name=name,
                bytes=self._written,
                sha256=self._hash.hexdigest(),
                samples=self._samples,
                duration=round(self._duration, 6),
                codec=self.compression,
            )
        )
        logger.debug("wrote shard %s: %d samples, %d bytes", name, self._samples, self._written)

    def end_shard(self) -> None:
        """Finish the current shard now; the next sample starts a new one (e.g. one shard per speaker)."""
        if self._closed:
            raise OptionError("this ShardWriter is closed")
        self._finish_shard()

    def close(self) -> Index:
        """Finish the last shard and write the index (last). Returns the index."""
        if self._closed:
            raise OptionError("this ShardWriter is already closed")
        try:
            self._finish_shard()
            self._closed = True
            index = self._builder.build()
            written = {s.name for s in index.shards}
            for stale in shard_files(self.directory, self.prefix) if self._overwrite else ():
                if os.path.basename(stale) not in written:  # the files overwrite=True replaces
                    os.unlink(stale)
            index.save(self.directory)
            self._journal.remove()
        finally:  # failed or not, this writer is done with the directory
            self._journal.close()
            self._lock.release()
        return index

    def abort(self) -> None:
        """Drop the shard being written; nothing half-written stays and no index is written. Finished shards
        stay, for the next writer into this directory to replace (the journal naming them stays too)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._partial(self._name(len(self._builder.shards))))
        if not any(os.path.lexists(os.path.join(self.directory, n)) for n in self._journal.names):
            self._journal.remove()
        self._journal.close()
        self._closed = True
        self._lock.release()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
