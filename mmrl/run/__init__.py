"""The run's input and output: the config schema and its checks, building a run from a config, checkpoints, the
metrics stream, reports and plots, export, cold starts (`sft`), and the torchrun / precision machinery."""
