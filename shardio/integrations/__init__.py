"""Trainer integrations (Lightning, Accelerate): each module imports its trainer, an optional extra, lazily."""
