"""``python -m mhsafeeval``: the same as the ``mhsafeeval`` command."""

from mhsafeeval.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
