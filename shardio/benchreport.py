"""Compatibility alias of :mod:`shardio.bench.report` (``write_results``), kept while scripts move over."""

from .bench.report import evaluate_targets, write_report, write_results

__all__ = ["evaluate_targets", "write_report", "write_results"]
