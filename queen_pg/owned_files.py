"""Files the broker keeps in a directory another account can write into: the embedded PostgreSQL's
data dir belongs to the ``postgres`` account when the broker runs as root, so any name in it may be a
symbolic link, a hard link, a FIFO or a device that account planted. Nothing here follows a link or
acts on a path twice: a file is opened once with ``O_NOFOLLOW`` and checked on its descriptor (a
regular file with one link, of the expected owner); a file is written as a new temporary file in the
same directory, given its mode and owner on the descriptor and renamed over the name (a rename replaces
a link itself, never its target). Imports nothing of ``queen_pg``."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path

READ_LIMIT = 1 << 20  # bytes read_owned returns at most: these files hold a line or a few


class UnsafeFile(ValueError):
    """A name that is not what the broker keeps there: a link, a directory, a FIFO, a device, a file
    with another owner or with more than one link."""


def open_owned(
    path: Path, flags: int = os.O_RDONLY, *, owners: Collection[int] | None = None, mode: int = 0o600
) -> int:
    """A descriptor of ``path`` (``flags``, ``mode`` when it is created), never through a symbolic link,
    checked on the descriptor: a regular file with one link (a directory when ``flags`` has
    ``O_DIRECTORY``) owned by one of ``owners`` (default: this process's effective uid).
    FileNotFoundError and FileExistsError pass through; anything else is UnsafeFile, naming the path."""
    allowed = {os.geteuid()} if owners is None else set(owners)
    # O_NONBLOCK: opening a FIFO must not wait for a writer (the fstat below refuses it); it changes
    # nothing for a regular file or a directory
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    except (FileNotFoundError, FileExistsError):
        raise
    except OSError as exc:  # ELOOP: a symbolic link; ENXIO: a FIFO nobody reads; ...
        kind = "a symbolic link" if os.path.islink(path) else exc.strerror
        raise UnsafeFile(f"{path} must be a regular file, not {kind}: refused") from None
    try:
        st = os.fstat(fd)
        want_dir = bool(flags & os.O_DIRECTORY)
        if want_dir and not stat.S_ISDIR(st.st_mode):
            raise UnsafeFile(f"{path} must be a directory: refused")
        if not want_dir and not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} must be a regular file, not {_kind(st.st_mode)}: refused")
        if not want_dir and st.st_nlink != 1:
            raise UnsafeFile(f"{path} has {st.st_nlink} hard links, it must have one: refused")
        if st.st_uid not in allowed:
            who = " or ".join(str(u) for u in sorted(allowed))
            raise UnsafeFile(f"{path} is owned by uid {st.st_uid}, it must be owned by uid {who}: refused")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_owned(path: Path, *, owners: Collection[int] | None = None, chmod: int | None = None) -> str | None:
    """The text of ``path`` (None: there is none), opened by :func:`open_owned`; at most READ_LIMIT
    bytes. ``chmod``: the mode set on the file's descriptor first."""
    try:
        fd = open_owned(path, owners=owners)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        if chmod is not None:
            os.fchmod(fd, chmod)
        return f.read(READ_LIMIT).decode(errors="replace")


def write_owned(path: Path, text: str, *, owner: tuple[int, int] | None = None, mode: int = 0o600) -> None:
    """``text`` into ``path`` replaced atomically (a reader never sees a partial file): a new file of a
    random name beside it, its mode and ``owner`` (uid, gid) set on the descriptor, renamed over ``path``.
    A link at ``path`` is replaced by the file; what it pointed to is left alone."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # O_EXCL | O_NOFOLLOW, 0600
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device"
