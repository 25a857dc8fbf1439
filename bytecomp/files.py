"""Atomic file and directory writes: readers never see half-written output."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bytecomp.errors import BytecompError


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def check_new_directory(path: str | os.PathLike, force: bool) -> Path:
    path = Path(path)
    if path.exists() and not force:
        raise BytecompError(f"{path} already exists (use --force to replace it)")
    if path.exists() and not path.is_dir():
        raise BytecompError(f"{path} exists and is not a directory")
    return path


@contextlib.contextmanager
def directory_atomic(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path``.

    On any error or interrupt the temporary directory is removed and ``path``
    is left as it was.
    """
    path = check_new_directory(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield temporary
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
