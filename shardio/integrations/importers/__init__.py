"""Importers: corpora other tools wrote (Hugging Face, Lhotse, NeMo) as
:class:`~shardio.packing.source.Source` s."""
