"""Reading planned batches: storage, remote reads, decoding, collation and batch assembly."""
