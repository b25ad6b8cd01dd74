"""A NeMo tarred-dataset manifest for a shardio dataset of ``.tar`` shards, written
beside it; no audio is copied.

NeMo's tarred loaders read WebDataset-style tars and join each audio member with the manifest entry whose
``audio_filepath`` has the same base name. shardio's ``.tar`` shards are such tars (the ``{key}.json`` members
are ignored by NeMo), so the export only writes ``tarred_audio_manifest.json``: one line per sample in index
order, ``audio_filepath`` = the audio member's name, ``shard_id`` = the shard's number, ``duration`` and every
field of the sample's metadata (``text``, ...: its ``{key}.json`` member's, or what the index keeps for a NeMo
dataset indexed in place), except ``offset``: a packed segment's member holds just the segment, and NeMo's
tarred loaders apply a manifest's ``offset`` to the member, so they would cut it again. Give NeMo the manifest
and the shards as a brace pattern (:func:`export_nemo` returns it). NeMo cannot seek into ``.tar.zst`` shards,
and it keys entries by base name, so a zstd dataset or two keys with one base name are a typed error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from ...errors import FormatError, OptionError
from ...reading.reader import Reader
from ...shards.index import Index
from ...storage.files import write_atomic

__all__ = ["NEMO_MANIFEST", "export_nemo"]

NEMO_MANIFEST = "tarred_audio_manifest.json"
_LINE_BREAKS = {ord(c): f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"}
"""Characters JSON may hold raw but ``str.splitlines`` (and so some manifest readers)
breaks lines at: escaped."""


def _lines(index: Index) -> Iterator[str]:
    reader = Reader(index)
    try:
        shard_ids = index.columns["shard"]
        frames, rates = index.columns["num_frames"], index.columns["sample_rate"]
        for sample, key in enumerate(index.keys):
            ext = index.formats[int(index.columns["format"][sample])]
            members = reader.members(sample)
            meta = index.metadata(sample)  # kept in the index (a NeMo dataset indexed in place), else {}
            if "json" in members:
                try:
                    meta = {**meta, **json.loads(bytes(members["json"]))}
                except ValueError:
                    raise FormatError(f"{reader.where(sample)}: the {key}.json member is not JSON") from None
            meta.pop(
                "offset", None
            )  # where a segment began in its recording: NeMo would cut the member again
            entry = {
                **meta,
                "audio_filepath": f"{key}.{ext}",
                "shard_id": int(shard_ids[sample]),
                "duration": round(int(frames[sample]) / max(int(rates[sample]), 1), 6),
            }
            text = json.dumps(entry, ensure_ascii=False, sort_keys=True)
            yield text.translate(_LINE_BREAKS) + "\n"
    finally:
        reader.close()


def export_nemo(
    directory: str | os.PathLike[str],
    manifest: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> str:
    """Write the NeMo manifest of the dataset at ``directory`` (default: ``tarred_audio_manifest.json`` in it)
    and return the brace pattern of its shards for NeMo's ``tarred_audio_filepaths``. An existing manifest
    (for a NeMo dataset indexed in place, the user's own) is replaced only with ``overwrite=True``."""
    path = os.fspath(manifest) if manifest is not None else os.path.join(os.fspath(directory), NEMO_MANIFEST)
    if os.path.exists(path) and not overwrite:
        raise OptionError(f"{path} exists; pass overwrite=True to replace it, or name another manifest path")
    index = Index.load(directory)
    codecs = sorted({s.codec for s in index.shards} - {"none"})
    if codecs:
        raise OptionError(
            f"{directory}: NeMo reads plain .tar shards; this dataset has {', '.join(codecs)} "
            "shards (pack with compression='none' to export it)"
        )
    seen: dict[str, str] = {}
    for key in index.keys:
        base = key.rsplit("/", 1)[-1]
        if base in seen:
            raise OptionError(
                f"{directory}: keys {seen[base]!r} and {key!r} share the base name {base!r}, which "
                "NeMo uses to join audio with the manifest"
            )
        seen[base] = key
    write_atomic(path, "".join(_lines(index)).encode("utf-8"))
    return _pattern([s.name for s in index.shards], os.fspath(directory))


def _pattern(names: list[str], directory: str) -> str:
    """``dir/shard-{000000..000011}.tar`` when the names allow a range, else a ``{a,b,c}`` list."""
    if len(names) == 1:
        return os.path.join(directory, names[0])
    stems = [n.rsplit("-", 1) for n in names]
    prefixes = {s[0] for s in stems if len(s) == 2}
    numbers = [s[1].split(".", 1)[0] for s in stems if len(s) == 2]
    if (
        len(prefixes) == 1
        and all(n.isdigit() for n in numbers)
        and len(numbers) == len(names)
        and [int(n) for n in numbers] == list(range(int(numbers[0]), int(numbers[0]) + len(numbers)))
    ):
        suffix = names[0].split(".", 1)[1]
        return os.path.join(directory, f"{prefixes.pop()}-{{{numbers[0]}..{numbers[-1]}}}.{suffix}")
    return os.path.join(directory, "{" + ",".join(names) + "}")
