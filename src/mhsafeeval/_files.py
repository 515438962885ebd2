"""Files the CLI writes: owner-only, and replaced whole or not at all.

Reports and exports hold transcripts, so they are created readable by their owner only, like
the event database. They are written to a temporary file next to the target, flushed to disk,
and renamed over it: a reader never sees half a file, and a failure (a full disk, a kill, a
fault mid-write) leaves whatever was there before exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from mhsafeeval.errors import InputError

__all__ = ["open_private_atomic", "write_private_atomic"]


def write_private_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8, newlines as given) atomically, mode ``0o600``.

    A symbolic link is followed: the file it points at is replaced, the link stays.

    Args:
        path: The file to create or replace.
        text: Its whole new content.

    Raises:
        InputError: The folder does not exist, ``path`` is a folder, or the file cannot be
            written there (permissions, a read-only file system, a full disk); the previous
            file, if any, is left unchanged. The folder must be writable, since the new file
            is created next to the old one and renamed over it.

    Example:
        >>> import pathlib, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     target = pathlib.Path(folder) / "report.txt"
        ...     write_private_atomic(target, "all clear\\n")
        ...     print(repr(target.read_text()), oct(target.stat().st_mode & 0o777))
        'all clear\\n' 0o600
    """
    with open_private_atomic(path) as out:
        out.write(text)


@contextlib.contextmanager
def open_private_atomic(path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """A text file (UTF-8, newlines as written) that replaces ``path`` only once the ``with``
    body has written all of it and left without an error, mode ``0o600``: what
    :func:`write_private_atomic` does, for a text written as it streams (an export).

    Raises:
        InputError: as :func:`write_private_atomic`; an error in the body leaves the previous
            file unchanged and is raised as it is.

    Example:
        >>> import pathlib, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     target = pathlib.Path(folder) / "records.jsonl"
        ...     with open_private_atomic(target) as out:
        ...         for n in range(3):
        ...             _ = out.write(f"{n}\\n")
        ...     print(target.read_text().split(), oct(target.stat().st_mode & 0o777))
        ['0', '1', '2'] 0o600
    """
    shown = Path(path)
    target = Path(os.path.realpath(shown))
    if target.is_dir():
        raise InputError(shown, None, "is a folder; name a file to write")
    folder = target.parent
    if not folder.is_dir():
        raise InputError(shown, None, f"cannot write: no such folder {folder}")
    try:  # mkstemp creates the file with O_EXCL and mode 0o600
        fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(shown, None, f"cannot create a file in {folder} ({_why(exc)})") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())  # the data is on disk before the rename makes it visible
        os.replace(temp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise InputError(
                shown, None, f"cannot write ({_why(exc)}); nothing was changed"
            ) from exc
        raise
    _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; some file systems cannot fsync a folder, and the file
    is complete either way."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
