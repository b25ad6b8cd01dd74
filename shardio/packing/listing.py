"""The corpus listing that starts a pack, with a progress counter: a folder of 100k files
takes minutes to walk."""

from __future__ import annotations

import os
import sys
from collections import Counter

from tqdm import tqdm

from .corpus import read_corpus
from .source import Problems, Source

__all__ = ["list_corpus"]


def list_corpus(
    input: str | os.PathLike[str],
    kind: str | None,
    *,
    problems: Problems,
    left_out: Counter[str],
    progress: bool,
) -> list[Source]:
    """Every source of :func:`~shardio.packing.corpus.read_corpus`, with a tqdm counter of the files found
    (``list``, no total: the count is what the listing finds) on stderr when ``progress``."""
    with tqdm(desc="list", unit="file", disable=not progress, file=sys.stderr) as bar:
        return list(read_corpus(input, kind, problems=problems, left_out=left_out, listed=bar.update))
