"""shardio: resumable, rank-balanced audio shard loading for PyTorch speech training."""

__version__ = "0.1.0"
