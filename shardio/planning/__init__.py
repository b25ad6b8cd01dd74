"""Pure planning over index metadata (no I/O, no torch): epoch plans, buckets, rounds, mixes."""
