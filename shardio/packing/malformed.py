"""Malformed: audio whose container structure, sizes or checksums are wrong (found without decoding)."""

from __future__ import annotations

__all__ = ["Malformed"]


class Malformed(Exception):
    """Audio bytes that break their container's rules; the message is the reason, without the file's bytes."""
