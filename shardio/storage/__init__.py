"""Storage: where bytes live and how they are reached, below the format and the reader: local paths and fsspec
URLs (files), filesystems, ranged HTTP/S3 reads held to one version (httpreads, s3reads, validators), retries,
whole-object copies, local shard files (localshard), the one lock primitive (locks) and the dataset-directory
lock on it (dirlock)."""
