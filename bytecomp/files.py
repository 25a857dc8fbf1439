"""Atomic file and directory writes, and checks of a user's input and output paths.

Readers never see half-written output; a path that cannot be read or written
is a one-line :class:`BytecompError` before any work starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bytecomp.errors import BytecompError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_text_file(path: str | os.PathLike, what: str = "file") -> str:
    """The text of an existing regular file, or a one-line error saying what is wrong."""
    path = Path(path)
    if not path.exists():
        raise BytecompError(f"{what} {path} does not exist")
    if path.is_dir():
        raise BytecompError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise BytecompError(f"{what} {path} is not a regular file")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise BytecompError(f"{what} {path} is not a text file (it is not valid UTF-8)") from None
    except OSError as error:
        raise BytecompError(f"cannot read {what} {path}: {error.strerror}") from None


def check_input_directory(path: str | os.PathLike, what: str = "directory") -> Path:
    """``path`` as an existing directory, or a one-line error."""
    path = Path(path)
    if not path.exists():
        raise BytecompError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise BytecompError(f"{what} {path} is not a directory")
    return path


def _check_parent_writable(path: Path, option: str) -> None:
    """The nearest existing ancestor of ``path`` must be a writable directory."""
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():
            raise BytecompError(f"{option} {path}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise BytecompError(f"{option} {path}: {parent} is a file, not a directory")
    try:  # a real probe: os.access says yes to root even where nothing can be created
        handle, probe = tempfile.mkstemp(prefix=".bytecomp-probe.", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise BytecompError(f"{option} {path}: cannot write in {parent} "
                            f"({error.strerror})") from None


def check_output_file(path: str | os.PathLike, option: str = "output") -> Path:
    """Check before any work that ``path`` can be written as a file; return it.

    ``option`` names where the path came from (``--out``) for the error line.
    """
    path = Path(path)
    if path.is_dir():
        raise BytecompError(f"{option} {path} is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise BytecompError(f"{option} {path} exists and is not a regular file")
    _check_parent_writable(path, option)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place.

    The file gets the usual permissions (0666 less the umask), not mkstemp's 0600.
    """
    path = check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                             dir=path.parent)
    except OSError as error:
        raise BytecompError(f"cannot write {path}: {error.strerror}") from None
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise BytecompError(f"cannot write {path}: {error.strerror}") from None
        raise


def check_new_directory(path: str | os.PathLike, force: bool, option: str = "--out") -> Path:
    """Check before any work that ``path`` can be created (or, with ``force``, replaced)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BytecompError(f"{option} {path} exists and is not a directory")
    if path.exists() and not force:
        raise BytecompError(f"{path} already exists (use --force to replace it)")
    _check_parent_writable(path, option)
    return path


@contextlib.contextmanager
def directory_atomic(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path``.

    On any error or interrupt the temporary directory is removed and ``path``
    is left as it was. The directory gets 0777 less the umask, not mkdtemp's 0700.
    """
    path = check_new_directory(path, force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp",
                                          dir=path.parent))
    except OSError as error:
        raise BytecompError(f"cannot write {path}: {error.strerror}") from None
    try:
        yield temporary
        os.chmod(temporary, 0o777 & ~_umask())
        if path.exists():
            backup = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old",
                                           dir=path.parent))
            os.rmdir(backup)
            os.replace(path, backup)
            os.replace(temporary, path)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(temporary, path)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
