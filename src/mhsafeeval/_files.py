"""Files the CLI writes: owner-only, and replaced whole or not at all.

Reports and exports hold transcripts, so they are created readable by their owner only, like
the event database. They are written to a temporary file next to the target, flushed to disk,
and renamed over it: a reader never sees half a file, and a failure (a full disk, a kill, a
fault mid-write) leaves whatever was there before exactly as it was. A report with side files
(its pages of transcripts) is a :class:`FileSet`: the side files are written aside and the whole
set replaces the previous one at once.

No output is ever written over something the package reads: :func:`check_output` refuses a
path that is one of the command's inputs, a SQLite database or a campaign config.

A temporary file or folder is locked (``flock``) by the process writing it, which removes it on
every way out but a kill; the kernel drops a dead process's locks, so the next write of the
same output removes what a killed one left (a temporary nobody holds is a dead writer's).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import os
import re
import secrets
import shutil
import stat
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from mhsafeeval.errors import InputError

__all__ = [
    "SQLITE_HEADER",
    "FileSet",
    "check_distinct",
    "check_output",
    "open_private_atomic",
    "write_private_atomic",
]

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""
_BESIDE = ("-wal", "-shm", "-journal", ".lock")  # kept beside a database by SQLite and the store
_CONFIG_BYTES = 1 << 20  # a campaign config is far smaller; a larger file is not read as one
_SET_NAME = re.compile(r"[0-9a-f]{16}")  # a published FileSet folder
_TEMP = re.compile(r"\.(?P<stem>.+)\.[0-9a-f]{16}\.tmp")  # what _claim names


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
            is created next to the old one and renamed over it. Also when ``path`` holds a
            SQLite database or a campaign config (:func:`check_output`).

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
    :func:`write_private_atomic` does, for a text written as it streams (an export). Its
    temporary file is removed on every way out; once it is in place, those that killed
    writers of ``path`` left are removed too.

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
    check_output(shown)
    if target.exists() and not target.is_file():
        # /dev/null, /dev/stdout, a named pipe: a stream to write into, never a file to
        # replace (as root, a rename over /dev/null would put a regular file in its place).
        try:
            with open(target, "w", encoding="utf-8", newline="") as stream:
                yield stream
        except OSError as exc:
            raise InputError(shown, None, f"cannot write ({_why(exc)})") from exc
        return
    try:
        temp, fd = _claim(folder, target.name, directory=False)
    except OSError as exc:
        raise InputError(shown, None, f"cannot create a file in {folder} ({_why(exc)})") from exc
    try:  # the descriptor holds the temporary file's lock until it is renamed
        with os.fdopen(fd, "w", encoding="utf-8", newline="", closefd=False) as out:
            yield out
            out.flush()
            os.fsync(fd)  # the data is on disk before the rename makes it visible
        os.replace(temp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise InputError(
                shown, None, f"cannot write ({_why(exc)}); nothing was changed"
            ) from exc
        raise
    finally:
        os.close(fd)
    _sync_folder(folder)
    _remove_dead(folder, target.name)


def check_distinct(*outputs: tuple[str, str | os.PathLike[str] | None]) -> None:
    """Refuse two outputs of one command on one path: the second would overwrite the first.

    Args:
        outputs: ``(option, path)`` pairs; a path of None is an option not given.

    Raises:
        InputError: naming the second option, its path and the first option.
    """
    seen: dict[str, str] = {}
    for option, path in outputs:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(
                f"{option} {path}", None, f"is the {seen[real]} file too: name another file"
            )
        seen[real] = option


def check_output(
    path: str | os.PathLike[str] | None,
    option: str | None = None,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    *,
    config_ok: bool = False,
) -> None:
    """Refuse to write ``path`` where that would destroy something this package reads.

    Every command checks each file it is about to write with this before it writes anything
    (and :func:`open_private_atomic` checks again, without ``inputs``). ``path`` is refused
    when it is the same file as one of ``inputs``, or as a file SQLite or the event store keeps
    beside one (``-wal``, ``-shm``, ``-journal``, ``.lock``), compared once ``..`` and symbolic
    links are resolved and by device and inode (a hard link); or when it already holds a
    SQLite database (its first 16 bytes are :data:`SQLITE_HEADER`) or, unless ``config_ok``,
    a campaign config (a TOML file with a ``[campaign]`` table).

    Args:
        path: The file about to be written; None (an option not given): nothing to check.
        option: The option that named it (``--out``), for the message.
        inputs: The files the command reads (None: an input not given).
        config_ok: An existing campaign config may be replaced (``init --force``).

    Raises:
        InputError: naming ``option``, ``path`` and the file it would destroy.
    """
    if path is None:
        return
    shown = f"{option} {path}" if option else str(path)
    for given in inputs:
        for candidate, what in () if given is None else _and_beside(given):
            if _same_file(path, candidate):
                raise InputError(
                    shown,
                    None,
                    f"is the same file as {what}, which this command reads: writing it would "
                    "destroy that; name another file",
                )
    if _is_database(path):
        raise InputError(
            shown,
            None,
            "already holds a SQLite database (a campaign's record?): writing it would destroy "
            "that; name another file",
        )
    if not config_ok and _is_campaign_config(path):
        raise InputError(
            shown,
            None,
            "already holds a campaign config: writing it would destroy that; name another file",
        )


class FileSet:
    """A main file and a folder of side files it refers to, replaced as one unit.

    The side files are written in a new folder inside ``folder`` (:meth:`side_folder`), which
    :meth:`publish` names :attr:`published` (a name unique to this set, :attr:`name`) before
    it replaces the main file, and only then removes the sets published before. So the main
    file refers to ``folder/NAME/...`` and a reader sees the previous main file with its own
    set or the new one with this set, never a mix. Leaving the ``with`` block unpublished
    removes what was written; what a killed writer left is removed by the next :meth:`publish`
    in ``folder``, as are the side files of an older layout matching ``legacy`` (a glob).

    Example:
        >>> import pathlib, tempfile
        >>> with tempfile.TemporaryDirectory() as where:
        ...     main = pathlib.Path(where) / "report.html"
        ...     with FileSet(main, main.with_name("report_files")) as files:
        ...         _ = (files.side_folder() / "p1.js").write_text("page 1")
        ...         files.publish(f"<script src='report_files/{files.name}/p1.js'></script>")
        ...     print((files.published / "p1.js").read_text(), len(list(files.folder.iterdir())))
        page 1 1
    """

    def __init__(
        self, main: str | os.PathLike[str], folder: Path, *, legacy: str | None = None
    ) -> None:
        self.main = Path(main)
        self.folder = folder
        self.name = secrets.token_hex(8)
        self.published = folder / self.name
        self._legacy = legacy
        self._staging: Path | None = None
        self._lock: int | None = None

    def __enter__(self) -> FileSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def side_folder(self) -> Path:
        """The folder to write the side files in, made owner-only on the first call; they are
        in :attr:`published` once :meth:`publish` returns.

        Raises:
            InputError: the folder cannot be made.
        """
        if self._staging is None:
            try:
                self.folder.mkdir(mode=0o700, exist_ok=True)
                self._staging, self._lock = _claim(self.folder, self.name, directory=True)
            except OSError as exc:
                raise InputError(
                    self.folder, None, f"cannot create the folder ({_why(exc)})"
                ) from exc
        return self._staging

    def publish(self, text: str) -> None:
        """Name the side folder :attr:`published`, replace the main file with ``text``
        (:func:`write_private_atomic`), then remove the sets published before this one and
        what dead writers left; one writer at a time per ``folder``.

        Raises:
            InputError: as :func:`write_private_atomic`; the previous set is left as it was.
        """
        with _folder_lock(self.folder):
            if self._staging is not None:
                try:
                    os.rename(self._staging, self.published)
                except OSError as exc:
                    raise InputError(self.folder, None, f"cannot write ({_why(exc)})") from exc
                self._staging = None
                _sync_folder(self.folder)
            try:
                write_private_atomic(self.main, text)
            except BaseException:
                shutil.rmtree(self.published, ignore_errors=True)  # nothing refers to it
                raise
            self._clear()

    def close(self) -> None:
        """Remove the side folder unless it was published, and let go of its lock."""
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _clear(self) -> None:
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return
        for entry in entries:
            if entry.name == self.name or entry.is_symlink():
                continue
            if entry.is_dir() and _SET_NAME.fullmatch(entry.name):
                shutil.rmtree(entry.path, ignore_errors=True)  # a set published before
            elif self._legacy and entry.is_file() and fnmatch.fnmatch(entry.name, self._legacy):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        _remove_dead(self.folder)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)  # only once empty


def _and_beside(given: str | os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """An input and the files kept beside it if it is a database (as given, and as SQLite
    names them: beside the file its links resolve to), each with how to name it."""
    named = os.fspath(given)
    yield named, named
    for suffix in _BESIDE:
        what = f"{named}{suffix} (kept beside {named})"
        yield named + suffix, what
        yield os.path.realpath(named) + suffix, what


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        one, other = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _head(path: str | os.PathLike[str], size: int) -> bytes | None:
    """The first ``size`` bytes of a regular file (never a pipe or a device), else None."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as file:
            return file.read(size)
    except OSError:
        return None


def _is_database(path: str | os.PathLike[str]) -> bool:
    return _head(path, len(SQLITE_HEADER)) == SQLITE_HEADER


def _is_campaign_config(path: str | os.PathLike[str]) -> bool:
    data = _head(path, _CONFIG_BYTES + 1)
    if data is None or len(data) > _CONFIG_BYTES:
        return False
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(table.get("campaign"), dict)


def _claim(folder: Path, stem: str, *, directory: bool) -> tuple[Path, int]:
    """A new temporary file (or folder) in ``folder``, named ``.STEM.RANDOM.tmp``, and a
    descriptor holding its lock. Made again if a cleaner took it for a dead writer's in the
    instant before it was locked."""
    while True:
        path = folder / f".{stem}.{secrets.token_hex(8)}.tmp"
        if directory:
            os.mkdir(path, 0o700)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
        else:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o600)
        with contextlib.suppress(OSError):  # no locks here: nothing is cleaned here either
            fcntl.flock(fd, fcntl.LOCK_EX)  # a cleaner holds it an instant at most
        if _is(path, fd):
            return path, fd
        os.close(fd)


def _remove_dead(folder: Path, stem: str | None = None) -> None:
    """Remove the temporaries in ``folder`` (of ``stem``; None: any) whose writer is dead: no
    process holds their lock."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        found = _TEMP.fullmatch(name)
        if found is None or stem not in (None, found["stem"]):
            continue
        path = folder / name
        try:  # never through a link; a pipe named so must not block
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not _try_lock(fd) or not _is(path, fd):
                continue
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        finally:
            os.close(fd)


def _try_lock(fd: int) -> bool:
    """Take ``fd``'s lock unless a live process holds it (False too where there are no locks)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _is(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named, held = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """One writer at a time publishes in ``folder`` (nothing to hold while it does not exist)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
