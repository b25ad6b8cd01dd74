"""Retries of remote reads: which failures are transient, and tenacity's loop under one :class:`RetryPolicy`.

A remote read that fails transiently (5xx, 408/429, a dropped connection, a timeout) is tried again after
an exponential backoff with jitter; once the attempts are spent, or at once for a failure that asking again
would not mend, it is a :class:`~shardio.errors.ReadError` naming what was read. This is the only retry layer
(:mod:`shardio.storage.files` turns botocore's and s3fs's own down). A shard that changed while the run
reads it (:mod:`shardio.storage.validators`) is never retried: it stays a
:class:`~shardio.errors.ShardChanged`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..checks.options import integer, real
from ..errors import OptionError, ReadError, ShardChanged

__all__ = ["RetryPolicy", "http_status", "is_transient", "retrying"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_ATTEMPTS = 1000
"""The most attempts a :class:`RetryPolicy` may make: retries are bounded, so a dead store fails the read."""
MAX_BACKOFF = 3600.0
"""The longest wait (seconds) before one retry."""

# Exception class names (anywhere in the MRO) of connection-level failures in aiohttp and botocore, whose
# types are not imported here: ServerDisconnectedError, ClientConnectionError, ClientPayloadError,
# botocore's ConnectionClosedError, ReadTimeoutError, EndpointConnectionError, ResponseParserError, ...
_TRANSIENT_NAMES = ("Timeout", "Connection", "Disconnect", "Payload", "IncompleteRead", "ResponseParser")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for remote reads: `attempts` in all, waiting about `backoff * 2**k` seconds
    (with +-25% jitter, at most `max_backoff`) before retry `k + 1`.

    Args:
        attempts: Tries in all, the first included (default 4; at most 1000). More attempts ride out a longer
            outage, and a dead store takes longer to fail.
        backoff: Seconds before the first retry (default 0.2), doubling for each next one.
        max_backoff: The longest wait before one retry, in seconds (default 5; at most 3600).

    Raises:
        OptionError: A value of the wrong type or out of range.
    """

    attempts: int = 4
    backoff: float = 0.2
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attempts", integer("RetryPolicy attempts", self.attempts, 1, MAX_ATTEMPTS))
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            what = f"a number of seconds from 0 to {MAX_BACKOFF:g}"
            real(f"RetryPolicy {name}", value, what)
            if not 0 <= value <= MAX_BACKOFF:
                raise OptionError(f"RetryPolicy {name} must be {what}, not {value}")

    def delay(self, retry: int) -> float:
        """Seconds to wait before a retry, with jitter.

        Args:
            retry: The retry's number (0 for the first).
        """
        return min(self.backoff * 2**retry, self.max_backoff) * random.uniform(0.75, 1.25)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (explicit causes, else implicit contexts)."""
    links = [exc]
    while len(links) < 8:
        following = links[-1].__cause__ or (None if links[-1].__suppress_context__ else links[-1].__context__)
        if following is None or following in links:
            break
        links.append(following)
    return links


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)  # aiohttp's ClientResponseError
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)  # botocore's ClientError (s3fs raises it as the cause)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(code, int):
            return code
    return None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of the first answer along ``exc``'s cause chain that carries one (None: none does)."""
    for link in _chain(exc):
        status = _http_status(link)
        if status is not None:
            return status
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether a failed remote read is worth retrying: a 5xx/408/429 answer, or a connection-level failure.

    The HTTP status is looked for along the exception's cause chain, because fsspec and s3fs re-raise
    (fsspec's HTTP ``size()`` turns a 503 into ``FileNotFoundError``; s3fs turns S3's 503 into ``OSError``).
    A missing object or a refused permission is not transient.
    """
    if isinstance(exc, ShardChanged):
        return False
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    for link in _chain(exc):
        if isinstance(link, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            continue
        if isinstance(link, (ConnectionError, TimeoutError)):
            return True
        if any(word in cls.__name__ for cls in type(link).__mro__ for word in _TRANSIENT_NAMES):
            return True
    return False


def retrying(
    action: Callable[[], T],
    where: str,
    retry: RetryPolicy,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``action()``, retried under ``retry`` while it fails transiently; then
    :class:`ReadError` naming ``where``.

    A ``FileNotFoundError`` that is not transient is re-raised as is, for the caller to name what is missing,
    unless an HTTP answer other than 404 is behind it (fsspec's HTTP ``size()`` turns any failure into one):
    that is a :class:`ReadError` naming the status, as a transient failure is once the attempts are spent.
    """
    try:
        import tenacity
    except ImportError:
        raise OptionError(f"{where}: remote reads need tenacity; install shardio[remote]") from None

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        assert exc is not None  # tenacity sleeps only after a failed attempt
        logger.warning(
            "%s: attempt %d of %d failed (%s: %s); retrying in %.2fs",
            where,
            state.attempt_number,
            retry.attempts,
            type(exc).__name__,
            exc,
            state.next_action.sleep if state.next_action else 0.0,
        )
        if on_retry is not None:
            on_retry(exc)

    attempts = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retry.attempts),
        wait=lambda state: retry.delay(state.attempt_number - 1),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return attempts(action)
    except ShardChanged as exc:
        raise ShardChanged(f"{where}: {exc}") from None
    except Exception as exc:  # every backend raises its own types: classified here
        transient, status = is_transient(exc), http_status(exc)
        if not transient and isinstance(exc, FileNotFoundError) and status in (None, 404):
            raise
        how = (
            f"after {attempts.statistics.get('attempt_number', retry.attempts)} attempt(s)"
            if transient
            else "(not retried: not a transient error)"
        )
        answer = (
            "" if status is None else f"the server answered HTTP {status}: "
        )  # fsspec may say FileNotFound
        raise ReadError(f"{where}: read failed {how}: {answer}{type(exc).__name__}: {exc}") from exc
