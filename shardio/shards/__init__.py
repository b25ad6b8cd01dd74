"""The dataset on disk: tar members, the index (its file and checks), sample keys, writing shards."""
