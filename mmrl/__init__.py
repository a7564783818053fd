"""mmrl: reinforcement learning for vision-language models and vision-language-action policies.

`import mmrl` needs only torch and transformers (plus small pure-Python helpers); simulators, renderers and
plotting are imported where they are used.

The folder shows the architecture: `trainer.py` is the loop, `stages/` its stages in order, `methods/` and `algos/`
what plugs into them, `policy/` the model, `run/` the run's input and output, `types.py` the data that flows between
them. The one map of the code is docs/design.md; `tests/test_imports.py` checks the direction of the imports.
"""

__version__ = "0.1.0"
