"""Exporters: a shardio dataset described for other tools (a NeMo tarred-dataset manifest)."""
