"""mmrl: reinforcement learning for vision-language models and vision-language-action policies.

`import mmrl` needs only torch and transformers (plus small pure-Python helpers); simulators, renderers and
plotting are imported where they are used.

Where things are (bottom up; a module imports only modules above it in this list, `tests/test_imports.py` checks):

* `types`: the data that flows (Sampling, Completions, Rollout, Episodes); imports nothing of the project.
* `algos`: advantage estimators, policy losses, PAPO and the objective, pure tensor functions behind registries.
* `config`: the schema (frozen dataclasses), presets and overrides, and every check of the values.
* `policy`: `VLMPolicy` (generate / logprobs), its generation backends, model options and action codec.
* `rollout`: episodes of one env batch; `collect`: one training step's episodes (seeds, shards, filters, workers).
* `build`: config -> a run (policy, reference, collector, optimiser); `report`: metrics, held-out lines, pictures.
* `trainer`: the one loop; `update`: a step's optimiser steps (PPO epochs, mini-batches); `critic`: the value
  head; `cli`: the `mmrl` command.
"""

__version__ = "0.1.0"
