"""Trainer integrations (Lightning, Accelerate); each module needs its trainer, an optional extra."""
