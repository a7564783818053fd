"""The run's schema and machinery, below the policy: the config schema and its checks, checkpoints, the metrics
stream, and the torchrun / precision machinery."""
