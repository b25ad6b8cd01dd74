"""A corpus into shards: inputs and their validation, packing engines, indexing foreign shards, verifying and
inspecting a dataset."""
