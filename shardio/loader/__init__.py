"""ShardLoader, shardio's own loader, which stands on the datasets: its worker processes (pool, server), their
pipes (channel, descriptors), credits, the word about a silent worker (silence) and
pinned memory (pinning)."""
