"""The keys pack gives its samples: the checks that need no audio (the key rule, unique keys, a known
extension, a transcript), keys rewritten to the rule on request, and a warning of keys that only case or
Unicode normalisation tells apart."""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Iterable, Sequence

from ..errors import InputProblem
from ..shards.names import key_problem
from .preparation import Task
from .source import AUDIO_EXTENSIONS, Source
from .structure import DEFAULT_VALIDATE

__all__ = ["assign_keys", "rewrite_key"]

logger = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")  # and the surrogates of a name's non-UTF-8 bytes


def rewrite_key(key: str) -> str:
    """``key`` made a valid WebDataset key: dots in the basename, control characters, bytes of a file name
    that are not UTF-8 and '.'/'..' parts become ``_``, empty path parts are dropped."""
    parts = [part for part in _CONTROL.sub("_", key).split("/") if part]
    parts = ["_" if part in (".", "..") else part for part in parts]
    if parts:
        parts[-1] = parts[-1].replace(".", "_")
    return "/".join(parts)


def assign_keys(
    sources: Sequence[Source],
    problems: list[InputProblem],
    *,
    transcode: str | None,
    validate: str = DEFAULT_VALIDATE,
    rewrite: bool,
    require_text: bool,
) -> list[Task]:
    """The checks that need no audio: format extension, key rule, unique keys, transcript (partitioned packing
    makes them too).

    Args:
        sources: the corpus's samples.
        problems: where each refused sample's problem is appended.
        transcode: the codec audio is transcoded to, if any.
        validate: the validation level (see :mod:`shardio.packing.structure`).
        rewrite: rewrite keys that break the key rule instead of refusing them.
        require_text: refuse a sample without a transcript.

    Returns:
        One packing task per accepted sample.
    """
    tasks: list[Task] = []
    seen: dict[str, Source] = {}
    for source in sources:
        key = rewrite_key(source.key) if rewrite else source.key
        was = f" (rewritten from {source.key!r})" if key != source.key else ""
        reason = None
        if source.ext not in AUDIO_EXTENSIONS:
            reason = (
                f"unknown audio format extension {'.' + source.ext if source.ext else '(none)'}; expected "
                f"one of {', '.join('.' + e for e in AUDIO_EXTENSIONS)}"
            )
        elif (problem := key_problem(key)) is not None:
            hint = "" if rewrite else "; pass rewrite_keys=True (--rewrite-keys) to rewrite it"
            reason = f"key {key!r}{was} breaks the '{{key}}.{{ext}}' member rule: {problem}{hint}"
        elif key in seen:
            other = seen[key]
            other_was = f" (rewritten from {other.key!r})" if other.key != key else ""
            formats = (
                "; the same name in two audio formats: keep one, or pack a manifest that lists one of them"
                if other.ext != source.ext
                else ""
            )
            reason = f"duplicate key {key!r}{was}: {other.where} has the same key{other_was}{formats}"
        elif require_text and not str(source.meta.get("text") or "").strip():
            reason = "no transcript: require_text asks for a non-empty 'text' for every input"
        if reason is not None:
            problems.append(InputProblem(source.where, key, reason))
            continue
        seen[key] = source
        tasks.append(Task(source, key, transcode, validate))
    _warn_of_lookalike_keys(seen)
    return tasks


def _warn_of_lookalike_keys(keys: Iterable[str]) -> None:
    """Warn of keys that differ only in case or Unicode normalisation (``Café``, ``café``, ``cafe\u0301``):
    distinct samples to shardio and WebDataset, but one file where the shards are extracted on a
    case-insensitive file system (macOS, Windows), and the same text in every message."""
    first: dict[str, str] = {}
    pairs = []
    for key in keys:
        folded = unicodedata.normalize("NFC", key).casefold()
        if folded in first:
            pairs.append((first[folded], key))
        else:
            first[folded] = key
    if pairs:
        logger.warning(
            "%d key(s) differ from another only in case or Unicode normalisation (first: %a and %a): "
            "they stay distinct samples, but name one file where the shards are extracted on a "
            "case-insensitive file system; --rewrite-keys does not merge them",
            len(pairs),
            *pairs[0],
        )
