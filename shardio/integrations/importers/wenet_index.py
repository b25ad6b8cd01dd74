"""A WeNet shard list indexed in place: ``shardio index --wenet-list data.list``.

WeNet's ``tools/make_shard_list.py`` writes tar shards (``shards_000000000.tar``, ...) holding, for each
utterance, a ``{key}.txt`` member (the transcript, UTF-8) and then its audio, ``{key}.wav`` (16-bit PCM),
and a ``data.list`` naming one shard a line; WeNet's ``data_type: shard`` reads the list, opens each line
as a path (relative to the directory the training runs in) and groups adjacent members by the name up to
its last dot. :func:`index_wenet` writes a shardio index for those shards without copying them, so the
same dataset reads through ``ShardDataset`` (``batch["text"]`` is the ``.txt`` member), and
:mod:`shardio.integrations.wenet` turns its batches into WeNet's sample dicts.

The list is read as ``shardio pack`` reads a manifest (:mod:`shardio.packing.manifestlines`): a regular
file, lines of at most 1 MiB. The index goes into ``out_dir`` (default: the list's directory), its root:
every shard a line names (relative lines resolve against the current directory, as WeNet opens them; symbolic
links are followed) must lie under that root. Each of these is an :class:`~shardio.errors.InputProblem`,
all raised together as one :class:`~shardio.errors.InputError`, before any shard is read: a URL (WeNet
streams ``http://`` shards through ``wget``; shardio indexes local files: index them where they are written,
then read them remotely through ``ShardDataset``), a shard outside the root, one listed twice, one missing
or not a regular file (a FIFO), a name that is not a tar shard's. Then, while the shards are read: a key
WeNet and shardio would read differently (WeNet's key ends at the member name's last dot, shardio's at the
first: ``utt.1.wav`` is WeNet's ``utt.1``), also an :class:`~shardio.errors.InputProblem`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlparse

from ...errors import FormatError, InputError, InputProblem, OptionError, ReadError, shown, shown_path
from ...packing.indexer import check_index_target, index_shards, shard_codec
from ...packing.manifestlines import check_manifest_file, manifest_lines
from ...packing.source import not_regular
from ...shards.index import Index
from ...shards.names import has_hidden

__all__ = ["index_wenet"]


def index_wenet(
    data_list: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Index:
    """Index the WeNet shards that ``data_list`` names, in place (see the module docstring), and return the
    index.

    Args:
        data_list: WeNet's shard list (``data.list``): one tar shard's path a line.
        out_dir: Where the index is written, the dataset's root (default: the list's directory); every
            shard must lie under it.
        overwrite: Replace an index already in ``out_dir``.
        progress: A tqdm bar of the bytes read, on stderr.

    Returns:
        The index, saved in ``out_dir``.

    Raises:
        ReadError: No file at ``data_list``.
        InputError: Every problem of the list and its shards (see the module docstring).
        OptionError: An index already in ``out_dir`` (without ``overwrite``), or ``out_dir`` not writable.
        FormatError: A list that names no shard, or a shard that is not a tar of samples.
    """
    list_path = os.fspath(data_list)
    try:
        check_manifest_file(list_path)
    except FileNotFoundError:
        raise ReadError(f"{shown_path(list_path)}: no such shard list") from None
    root = os.path.realpath(os.fspath(out_dir) if out_dir is not None else os.path.dirname(list_path) or ".")
    problems: list[InputProblem] = []
    paths = list(_shard_paths(list_path, root, problems))
    if problems:
        raise InputError(problems)
    if not paths:
        raise FormatError(f"{shown_path(list_path)}: names no shards")
    check_index_target(root, overwrite)

    def check(path: str, key: str, ext: str) -> None:
        if "." in ext:
            problems.append(
                InputProblem(
                    shown_path(path),
                    key,
                    f"the member {shown(key + '.' + ext)} is WeNet's key "
                    f"{shown(key + '.' + ext.rsplit('.', 1)[0])} (up to the last dot) but shardio's "
                    f"{shown(key)} (up to the first): rename the utterance without dots",
                )
            )

    index = index_shards(paths, root, progress=progress, check=check)
    if problems:
        raise InputError(problems)
    index.save(root)
    return index


def _shard_paths(list_path: str, root: str, problems: list[InputProblem]) -> Iterator[str]:
    """The real path of each shard the list names; a line that cannot be one is a problem instead."""
    seen: dict[str, str] = {}
    for number, text in manifest_lines(list_path, problems):
        where, line = f"{shown_path(list_path)}:{number}", text.strip()
        reason = _line_problem(line)
        if reason is not None:
            problems.append(InputProblem(where, "", reason))
            continue
        parsed = urlparse(line)
        path = os.path.realpath(parsed.path if parsed.scheme == "file" else line)
        reason = _path_problem(path, root)
        if reason is None and path in seen:
            reason = (
                f"the shard {shown_path(line)} is listed twice (first at {seen[path]}); each is indexed once"
            )
        if reason is not None:
            problems.append(InputProblem(where, "", reason))
            continue
        seen[path] = where
        yield path


def _line_problem(line: str) -> str | None:
    if "\x00" in line or has_hidden(line):
        return f"the line {shown(line)} holds a control character; expected a shard's path"
    scheme = urlparse(line).scheme
    if scheme not in ("", "file"):
        return (
            f"{shown(line)} is a {scheme}:// URL; shardio indexes local shards: index them where they "
            "are written, then read the dataset remotely through ShardDataset"
        )
    return None


def _path_problem(path: str, root: str) -> str | None:
    if os.path.commonpath([root, path]) != root:
        return (
            f"the shard {shown_path(path)} lies outside the index's directory {shown_path(root)}, where the "
            "loader refuses to read: write the index higher up (--out), or move the shards in"
        )
    try:
        shard_codec(path)
    except OptionError:
        return f"{shown_path(path)} is not a tar shard's name (.tar, .tar.gz, .tar.zst, .tar.bz2)"
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot read the shard {shown_path(path)} ({exc.strerror or exc})"
    problem = not_regular(mode)
    return None if problem is None else f"cannot read the shard {shown_path(path)}: {problem}"
