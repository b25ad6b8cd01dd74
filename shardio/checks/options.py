"""Checks of option values, shared by the option dataclasses: each returns the value (an ``int`` for an
integer option, a ``bool`` for a flag) or raises an :class:`~shardio.errors.OptionError` naming the option,
the value given and what was expected. ``bool`` is refused where a number is meant (``True`` would read as
1)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import OptionError, shown

__all__ = ["MAX_INT64", "flag", "integer", "real"]

MAX_INT64 = 2**63 - 1
"""The largest integer option a plan may take: a state records the plan's options, and a state's integers are
int64 (larger ones are refused when it loads), so a larger option would save states that never load."""


def integer(name: str, value: object, least: int | None, most: int | None = None) -> int:
    """``value`` as an ``int`` from ``least`` to ``most`` (None: unbounded; numpy integers too; not a bool, a
    float or a string)."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    number = int(value) if ok else 0  # type: ignore[call-overload]
    if not ok or (least is not None and number < least) or (most is not None and number > most):
        span = (
            f" from {least} to {most}"
            if least is not None and most is not None
            else f" of at least {least}"
            if least is not None
            else ""
        )
        raise OptionError(f"{name} must be an integer{span}, not {shown(value)}")
    return number


def real(name: str, value: object, what: str) -> float:
    """``value`` as a ``float``, refused where it is not a real number (a bool, a string, None) or not finite;
    ``what`` says what was expected (``"a positive, finite number of seconds"``). Range checks are the
    caller's. A numpy float or a ``Fraction`` becomes a Python ``float``, what a state records (JSON)."""
    try:
        finite = math.isfinite(value)  # type: ignore[arg-type]
    except (TypeError, OverflowError):  # not a number; an int beyond a float
        finite = False
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)) or not finite:
        raise OptionError(f"{name} must be {what}, not {shown(value)}")
    return float(value)


def flag(name: str, value: object) -> bool:
    """``value`` as a ``bool`` (``True``/``False``, or a numpy bool): a string such as ``"no"`` would read as
    true."""
    if not isinstance(value, (bool, np.bool_)):
        raise OptionError(f"{name} must be True or False, not {shown(value)}")
    return bool(value)
