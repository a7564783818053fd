"""The one exception type for a user's mistake in what they hand the project: data, env options, checkpoints.

`InputError` is what `mmrl` (the command line) turns into one line and exit code 2; anything else that escapes is a
bug and keeps its traceback. Its message names what is wrong where: the file and line (or row) and the field, or the
option, and what was expected. It lives in `sim`, the lowest package that raises it (`mmrl` imports `sim`, never the
other way); `mmrl.runtime.config.ConfigError` is its counterpart for config files and overrides.

It subclasses `ValueError`, so code that caught the `ValueError`s these checks raised before still catches them.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user (a dataset record, an env option, a checkpoint folder); the message names it."""
