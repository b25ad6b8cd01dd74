"""A corpus into shards: inputs and their validation, packing engines, and index/verify/inspect."""
