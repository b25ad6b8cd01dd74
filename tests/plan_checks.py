"""Checks shared by the planner's tests: what an elastic resume of a plan must consume."""

from __future__ import annotations

from collections import Counter

from shardio.planning.plan import EpochPlan


def assert_rest_consumes_each_once(full: EpochPlan, rest: EpochPlan, consumed: int) -> None:
    """``rest`` (planned after ``consumed`` batches a rank of ``full``) and those batches consume every
    occurrence of ``full``'s epoch exactly once (a mix draws a sample once per pass of its corpus); an epoch
    of ``batches`` filled by repeating batches is held to its samples only (the repeats are like padding)."""
    together = Counter(full.consumed_samples(consumed).tolist()) + Counter(rest.samples.tolist())
    if full.report.get("repeated", 0) == 0:
        assert together == Counter(full.samples.tolist())
    else:
        assert set(together) == set(full.samples.tolist())
