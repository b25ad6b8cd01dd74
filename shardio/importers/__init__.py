"""Importers: corpora other tools wrote (Hugging Face datasets, Lhotse) as :class:`~shardio.source.Source` s for pack."""
