"""mmrl: reinforcement learning for vision-language models and vision-language-action policies.

`import mmrl` needs only torch and transformers (plus small pure-Python helpers); simulators, renderers and
plotting are imported where they are used.
"""

__version__ = "0.1.0"
