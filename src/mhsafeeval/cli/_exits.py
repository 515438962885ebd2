"""How a command ends: the exit codes, SIGTERM handled at any moment, and the one stderr line
(never a traceback) for what stopped a command."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from mhsafeeval._terminal import visible
from mhsafeeval.errors import InputError, MhSafeEvalError
from mhsafeeval.framework import redact

EXIT_INPUT = 2
EXIT_BUDGET = 3
EXIT_GATE = 4  # the campaign finished and a [gate] / --fail-above limit is exceeded
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141  # stdout closed by its reader (128 + SIGPIPE, as a shell reports it)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)


class _Terminated(BaseException):
    """SIGTERM arrived: the command was cancelled like on Ctrl-C. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on its way takes it for an error."""


class _Sigterm:
    """SIGTERM at any moment: one line, exit 143, within a second or two.

    A Python-level handler, installed first thing in :func:`main`, runs in the main thread at
    the next bytecode, even while that thread is busy in synchronous work (an import of a
    provider SDK, a model file's checksum, a test generation). Outside an event loop it raises
    :class:`_Terminated` right there: nothing is open yet. Inside one (:func:`_until_sigterm`)
    it asks the loop to cancel the command's task, exactly as Ctrl-C does (calls in flight are
    cancelled; the store, still running, records the run as ``interrupted`` and is flushed).
    If the loop has not taken that request within :data:`GRACE_S` (it is blocked in
    synchronous work), the signal is sent to the main thread again and the handler raises in
    that work instead.

    (asyncio's ``add_signal_handler`` would wait for the loop: 15-19 s behind a litellm import
    on a loaded machine. Cancelling a cancel scope around the command would not do either: it
    would cancel the store's writer before the store could record how the run ended.)
    """

    GRACE_S = 0.5

    def __init__(self) -> None:
        self.loop: Any = None
        self.task: Any = None
        self.asked_at: float | None = None
        self.taken = False
        self.finished = False

    def install(self) -> Any:
        """Handle SIGTERM from now on (main thread only); returns the handler it replaced."""
        self.loop = self.task = self.asked_at = None
        self.taken = self.finished = False
        if threading.current_thread() is not threading.main_thread():
            return None
        return signal.signal(signal.SIGTERM, self.handle)

    def restore(self, previous: Any) -> None:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)

    def handle(self, _signum: int, _frame: object) -> None:
        if self.finished:  # main() returned: the interpreter is ending, nothing is open
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                print("mhsafeeval: terminated (SIGTERM)", file=sys.stderr, flush=True)
            os._exit(EXIT_TERMINATED)
        loop, task = self.loop, self.task
        if loop is None or task is None or loop.is_closed() or self.asked_at is not None:
            if not self.taken:  # no loop, or a loop that did not answer in time
                raise _Terminated
            return  # the cancellation is under way: let it finish
        self.asked_at = time.monotonic()
        loop.call_soon_threadsafe(self._cancel, task)
        timer = threading.Timer(self.GRACE_S, self._remind)
        timer.daemon = True
        timer.start()

    def _cancel(self, task: Any) -> None:
        self.taken = True
        if not task.done():  # else the command ended meanwhile (it raised in blocked work)
            task.cancel()

    def _remind(self) -> None:
        if not self.taken:  # a real signal: it also cuts a blocking system call (a sleep)
            main = threading.main_thread().ident
            if main is not None:
                signal.pthread_kill(main, signal.SIGTERM)  # handle() again, in the main thread


_sigterm = _Sigterm()


async def _until_sigterm(
    command: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace
) -> int:
    """Run ``command``; on SIGTERM cancel it as Ctrl-C does and raise :class:`_Terminated`
    (see :class:`_Sigterm`)."""
    import asyncio

    task = asyncio.current_task()
    if task is None or threading.current_thread() is not threading.main_thread():
        return await command(args)  # signals reach the main thread only
    _sigterm.loop, _sigterm.task = asyncio.get_running_loop(), task
    try:
        return await command(args)
    except asyncio.CancelledError:
        if _sigterm.taken:
            raise _Terminated from None
        raise
    finally:
        _sigterm.loop = _sigterm.task = None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _failed(exc: BaseException, *, debug: bool) -> int:
    """One line on stderr and the exit code for what ended a command; never a traceback
    (unless ``--log-level debug``). Exception groups from task groups are looked inside."""

    leaves = _leaves(exc)

    def first(kind: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
        return next((e for e in leaves if isinstance(e, kind)), None)

    if first(KeyboardInterrupt) is not None:
        print("mhsafeeval: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if first(_Terminated) is not None:
        print("mhsafeeval: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    if first(BrokenPipeError) is not None:
        # The reader went away (`mhsafeeval report DB | head`): nothing more can be shown.
        # Point stdout at /dev/null so the interpreter's last flush stays quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    shown = first(InputError) or first(MhSafeEvalError) or leaves[0]
    ours = isinstance(shown, MhSafeEvalError)
    text = str(shown) if ours else f"{type(shown).__name__}: {shown}"
    # Error text may quote what came from outside (a file, an app's answer): no key in it.
    print(f"mhsafeeval: error: {visible(redact(text))}", file=sys.stderr)
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    elif not isinstance(shown, MhSafeEvalError):
        print("mhsafeeval: (run with --log-level debug for the traceback)", file=sys.stderr)
    return EXIT_INPUT if isinstance(shown, InputError) else 1
