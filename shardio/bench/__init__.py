"""``shardio bench`` and the measuring, corpora and reporting helpers of ``benchmarks/``."""

from .run import FULL, QUICK, BenchConfig, run_bench

__all__ = ["FULL", "QUICK", "BenchConfig", "run_bench"]
