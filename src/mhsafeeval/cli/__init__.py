"""The ``mhsafeeval`` command line. The composition root: the only package that knows every
layer.

This module holds :func:`main` (the console script's entry point, also ``python -m mhsafeeval``)
and runs the parsed command; the rest is grouped by what a user does:

* ``_arguments``: the argparse parser, every command and its options;
* ``_run``: ``run`` (a campaign, its resume, the offline demo, ``--estimate``) and ``ablate``;
* ``_reports``: reading a stored campaign: ``report``, ``compare``, ``export``, ``events``,
  ``view``;
* ``_judging``: asking judge models again: ``calibrate`` and ``rejudge``;
* ``_setup``: before a run: ``providers``, ``profiles``, ``taxonomy``, ``check``, ``init``;
* ``_gate``: the CI gate's options and decision, shared by ``run``, ``check`` and ``report``;
* ``_exits``: the exit codes, SIGTERM, and the one line printed for what stopped a command.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
from collections.abc import Sequence

import anyio

from ._arguments import Handler, _parser

# The exit codes, importable from here as they were from the one module this package was.
from ._exits import EXIT_BUDGET as EXIT_BUDGET
from ._exits import EXIT_GATE as EXIT_GATE
from ._exits import EXIT_INPUT as EXIT_INPUT
from ._exits import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from ._exits import EXIT_PIPE as EXIT_PIPE
from ._exits import EXIT_TERMINATED as EXIT_TERMINATED
from ._exits import _failed, _sigterm, _Terminated, _until_sigterm

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code (see the README's list): 0
    done, 1 some conversations failed, 2 bad input, 3 budget stop, 4 a finished campaign
    exceeded its gate (``[gate]``, ``--fail-above``), 130 interrupted, 141 stdout closed,
    143 SIGTERM."""
    previous = _sigterm.install()
    try:
        code = _main(argv)
    except _Terminated:  # between two steps of the command, or while it printed its last lines
        print("mhsafeeval: terminated (SIGTERM)", file=sys.stderr)
        code = EXIT_TERMINATED
    finally:
        if argv is None:  # the console script: the interpreter ends next
            _sigterm.finished = True
        else:  # a caller in the same process gets its own handler back
            _sigterm.restore(previous)
    if code == EXIT_TERMINATED and argv is None:
        # Everything is stored and closed: skip tearing down the interpreter's modules (half a
        # second with litellm loaded), as the signal's default action would.
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from mhsafeeval.framework import configure_logging

    configure_logging(args.log_level, json=args.log_json)
    try:
        code = _dispatch(parser, args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return code
    except BaseException as exc:  # groups from task groups, SIGTERM and Ctrl-C too
        if isinstance(exc, SystemExit):
            raise
        return _failed(exc, debug=args.log_level.lower() == "debug")


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the subcommand's handler: an ``async`` one in its own event loop, where SIGTERM
    stops it as Ctrl-C does."""
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:  # no subcommand
        parser.print_help()
        return 0
    if inspect.iscoroutinefunction(handler):
        code: int = anyio.run(_until_sigterm, handler, args)
        return code
    return handler(args)  # type: ignore[return-value]  # not a coroutine function
