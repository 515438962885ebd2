"""``python -m mhsafeeval.cli``: the same as the ``mhsafeeval`` command."""

import sys

from mhsafeeval.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
