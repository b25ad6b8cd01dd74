"""The datasets: ShardDataset (dataset, its plans in epochplans, its checks) and MixedDataset (mixed), each a
planner, a reader and the runtime under it, and nothing else."""
