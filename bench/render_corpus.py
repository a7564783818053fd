"""The whole real-world render corpus (`rewards.render.corpus`): SVG files shipped in the installed packages, the
SVGs matplotlib writes for a set of chart scripts, and those scripts as charts; each rendered in the sandbox and
outside it. Prints every refusal with its reason and every render that differs; exit status 1 if any.

    .venv/bin/python bench/render_corpus.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards.render.corpus import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
