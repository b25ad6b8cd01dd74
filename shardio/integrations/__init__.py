"""Other tools: trainers (Lightning, Accelerate: each an optional extra), importers, exporters."""
