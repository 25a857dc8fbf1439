"""Reading a user's files, writing outputs atomically, and checking both before any work.

* Every file bytecomp reads goes through :func:`read_text_file`: a regular file
  (never a FIFO, a device or a directory), at most :data:`MAX_INPUT_BYTES`,
  valid UTF-8. YAML is parsed by :func:`bytecomp.safe_yaml.load_yaml`:
  ``yaml.safe_load``'s types, no anchors or aliases (a "billion laughs" file cannot
  expand), a bounded nesting depth and no duplicate keys.
* Outputs are written in private temporary directories named
  ``.<name>.<pid>.<random>.tmp`` beside them (holding bytecomp's marker file) and
  renamed into place; a run removes the temporaries that runs killed outright (their
  process is gone) left beside its outputs, and nothing else named like them. An output
  path the user named that is a symbolic link is followed (the file it points to is
  replaced, the link stays); a side file the user did not name (a plan's evidence) that
  is a link is refused.
* Files that live only while a run does go to :func:`scratch_directory`, under
  ``$TMPDIR/bytecomp-<uid>/``; what a killed run left there the next run removes.
* :func:`check_output_file`, :func:`check_new_directory` and
  :func:`check_outputs_spare_inputs` run before any work: a path that cannot be
  written, or an output that would overwrite one of the command's inputs, is a
  one-line :class:`BytecompError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from bytecomp.errors import BytecompError

MAX_INPUT_BYTES = 64 << 20  # the largest shipped profile table is under 1 MiB


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _os_error(what: str, path, error: OSError) -> BytecompError:
    return BytecompError(f"{what} {path}: {error.strerror or error}")


# -- reading -----------------------------------------------------------------------------


def read_text_file(path: str | os.PathLike, what: str = "file",
                   limit: int = MAX_INPUT_BYTES) -> str:
    """The text of an existing regular file of at most ``limit`` bytes, or a one-line
    error saying what is wrong. The file is opened without blocking and checked
    again once open, so a FIFO or a device is refused, never read."""
    path = Path(path)
    try:
        if not path.exists():
            raise BytecompError(f"{what} {path} does not exist")
        if path.is_dir():
            raise BytecompError(f"{what} {path} is a directory, not a file")
        if not path.is_file():
            raise BytecompError(f"{what} {path} is not a regular file")
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise _os_error(f"cannot read {what}", path, error) from None
    with open(handle, "rb") as stream:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise BytecompError(f"{what} {path} is not a regular file")
        if info.st_size > limit:
            raise BytecompError(f"{what} {path} is too large ({info.st_size:,} bytes; "
                                f"at most {limit:,})")
        try:
            data = stream.read(limit + 1)
        except OSError as error:
            raise _os_error(f"cannot read {what}", path, error) from None
    if len(data) > limit:
        raise BytecompError(f"{what} {path} is too large (more than {limit:,} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BytecompError(f"{what} {path} is not a text file (it is not valid UTF-8)") from None


def control_character(text: str) -> str | None:
    """The first control or format character in ``text`` (an escape sequence's ESC, a
    bell, a bidirectional override: what a terminal takes as a command, not as part of a
    name), as Python writes it (``'\\x1b'``), or None. Names read from files and printed
    (a cluster's, a tensor's, a finalist's) must have none."""
    for character in text:
        if unicodedata.category(character) in ("Cc", "Cf"):
            return ascii(character)
    return None


def check_input_directory(path: str | os.PathLike, what: str = "directory") -> Path:
    """``path`` as an existing directory, or a one-line error."""
    path = Path(path)
    try:
        if not path.exists():
            raise BytecompError(f"{what} {path} does not exist")
        if not path.is_dir():
            raise BytecompError(f"{what} {path} is not a directory")
    except OSError as error:
        raise _os_error(what, path, error) from None
    return path


# -- checking outputs ----------------------------------------------------------------------


def _resolved(path: str | os.PathLike) -> Path:
    """``path`` with every symbolic link followed (also a dangling one's target)."""
    return Path(os.path.realpath(path))


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


def _checked(option: str, path, check) -> Path:
    """Run ``check()``; an OSError (a name too long, a loop of links) is one line."""
    try:
        return check()
    except OSError as error:
        raise _os_error(option, path, error) from None


def check_output_file(path: str | os.PathLike, option: str = "output") -> Path:
    """Check before any work that ``path`` can be written as a file; return the path
    to write: ``path``, or the file it links to (links are followed).

    ``option`` names where the path came from (``--out``) for the error line.
    """
    def check() -> Path:
        target = _resolved(path)
        if target.is_dir():
            raise BytecompError(f"{option} {path} is a directory; give a file name")
        if target.exists() and not target.is_file():
            raise BytecompError(f"{option} {path} exists and is not a regular file")
        _check_name_length(target, f"{option} {path}: the file name is too long")
        _check_parent_writable(target, option)
        return target

    return _checked(option, path, check)


def _check_name_length(target: Path, message: str) -> None:
    """``target``'s name leaves room for the temporaries' ``.<name>.<pid>.<random>.tmp``
    within the file system's name limit, or ``message`` as the error."""
    if len(target.name.encode()) > os.pathconf(_existing_ancestor(target), "PC_NAME_MAX") - 40:
        raise BytecompError(message)


def _existing_ancestor(path: Path) -> Path:
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_new_directory(path: str | os.PathLike, force: bool, option: str = "--out",
                        inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Check before any work that ``path`` can be created (or, with ``force``, replaced:
    never a directory holding one of ``inputs`` or the working directory)."""
    def check() -> Path:
        target = Path(path)
        if target.exists() and not target.is_dir():
            raise BytecompError(f"{option} {target} exists and is not a directory")
        if target.exists() and not force:
            raise BytecompError(f"{target} already exists (use --force to replace it)")
        if target.exists():
            resolved = _resolved(target)
            for inside in [*inputs, Path.cwd()]:
                if resolved == _resolved(inside) or resolved in _resolved(inside).parents:
                    raise BytecompError(f"{option} {target} holds {inside}, which replacing "
                                        f"it would delete; choose another directory")
        _check_name_length(target, f"{option} {target}: the directory name is too long")
        _check_parent_writable(target, option)
        return target

    return _checked(option, path, check)


def check_outputs_spare_inputs(outputs: Mapping[str, str | os.PathLike | None],
                               inputs: Iterable[str | os.PathLike]) -> None:
    """An output that is one of the command's inputs (the same file, through links or
    hard links too) is an error before any work; so are two outputs on one file."""
    sources = [Path(p) for p in inputs]
    seen: dict[Path, str] = {}
    for option, output in outputs.items():
        if output is None:
            continue
        target = _checked(option, output, lambda output=output: _resolved(output))
        for source in sources:
            if _same_file(target, source):
                raise BytecompError(f"{option} {output} is the input {source}: writing it "
                                    f"would destroy it; choose another output")
        if target in seen:
            raise BytecompError(f"{seen[target]} and {option} name the same file {output}")
        seen[target] = option


def _same_file(a: Path, b: Path) -> bool:
    try:
        if _resolved(a) == _resolved(b):
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# -- temporaries ----------------------------------------------------------------------------
#
# Every temporary of a run lives in a private directory of its own beside the output,
# ``.<name>.<pid>.<random>.tmp/`` (0700, made by mkdtemp), whose first entry is a marker
# file bytecomp wrote. A stale one (its process gone) is recognised by that marker and by
# holding nothing but bytecomp's own entries; anything else named like one is a user's and
# is never removed, restored or emptied.

MARKER = ".bytecomp-temporary"
_NEW, _PREVIOUS = "new", "previous"  # a directory swap's new output and the one it replaces


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _marker_text(purpose: str) -> str:
    return f"bytecomp temporary: {purpose}, process {os.getpid()}\n"


def _private_directory(parent: Path, prefix: str, purpose: str) -> Path:
    """A new directory ``<prefix><random>.tmp`` in ``parent`` holding bytecomp's marker."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent))
    handle = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
    with open(handle, "w") as stream:
        stream.write(_marker_text(purpose))
    return folder


def _is_ours(folder: Path, allowed: set[str] | None) -> bool:
    """Whether ``folder`` is a private directory bytecomp made: a real directory (not a
    link) of this user, holding a regular marker file in bytecomp's words and no entry
    but the marker and ``allowed`` (None: anything, inside the user's private scratch
    root, where only bytecomp writes)."""
    try:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        names = set(os.listdir(folder))
        if MARKER not in names or (allowed is not None and not names <= allowed | {MARKER}):
            return False
        handle = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC)
        with open(handle, "rb") as stream:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                return False
            return stream.read(256).startswith(b"bytecomp temporary: ")
    except OSError:
        return False


def _remove_private(folder: Path) -> None:
    """Remove a private directory this process made, with whatever it still holds."""
    shutil.rmtree(folder, ignore_errors=True)


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the private temporary directories beside ``path`` that runs killed outright
    left (named ``.<name>.<pid>.<random>.tmp``, their process gone, holding bytecomp's
    marker and nothing else of anyone's); where one was killed between a directory swap's
    two renames and ``path`` is missing, the directory it was replacing is put back.
    Returns what was removed. An entry named so that is not provably bytecomp's (no
    marker, a user's file inside, a link, another user's) is left alone."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[A-Za-z0-9_]+\.tmp")
    removed: list[Path] = []
    try:
        entries = list(path.parent.iterdir()) if path.parent.is_dir() else []
    except OSError:
        return removed
    for entry in sorted(entries):
        match = pattern.fullmatch(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        if not _is_ours(entry, {path.name, _NEW, _PREVIOUS}):
            continue
        previous = entry / _PREVIOUS
        try:
            if previous.is_dir() and not previous.is_symlink() and not os.path.lexists(path):
                os.replace(previous, path)  # killed between its two renames: put it back
        except OSError:
            continue
        _remove_private(entry)
        removed.append(entry)
    return removed


def check_side_file(path: str | os.PathLike, option: str = "output") -> Path:
    """Check before any work that ``path``, a file bytecomp writes beside an output the
    user named (``option``), can be written: never a symbolic link, which could point
    anywhere (a planted link would overwrite any file the user can write). Returns
    ``path`` itself."""
    path = Path(path)
    if path.is_symlink():
        raise BytecompError(f"{path}, written beside {option}, is a symbolic link; bytecomp "
                            f"does not write through links to files it was not given: "
                            f"remove the link or choose another {option}")
    check_output_file(path, option)
    return path


@contextlib.contextmanager
def atomic_files(paths: Sequence[str | os.PathLike],
                 follow_links: bool = True) -> Iterator[list[Path]]:
    """Yield a temporary path beside each of ``paths``; when the block succeeds, rename
    every temporary into place, else remove them all. A failure while writing any of
    them (a full disk) leaves every output as it was. Files get the usual permissions
    (0666 less the umask).

    ``follow_links``: a path the user named may be a link (the file it points to is
    replaced, the link stays); with False (the files written beside an output, which
    the user never named) a path that is a link is a one-line error, and the final
    rename replaces the directory entry itself, never a file a link planted after the
    check points to."""
    targets = [check_output_file(path) if follow_links
               else check_side_file(path) for path in paths]
    folders: list[Path] = []
    temporaries: list[Path] = []
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(target)
            folder = _private_directory(target.parent, _temporary_prefix(target),
                                        f"writing {target.name}")
            folders.append(folder)
            temporary = folder / target.name
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600))  # empty, as mkstemp left it
            temporaries.append(temporary)
        yield temporaries
        for temporary in temporaries:
            os.chmod(temporary, 0o666 & ~_umask())
        for temporary, target in zip(temporaries, targets):
            os.replace(temporary, target)
    except OSError as error:
        named = {str(t): target for t, target in zip(temporaries, targets)}
        failed = named.get(str(error.filename), error.filename) or \
            " and ".join(str(target) for target in targets)
        raise BytecompError(f"cannot write {failed}: {error.strerror or error}") from None
    finally:
        for folder in folders:
            _remove_private(folder)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place."""
    with atomic_files([path]) as (temporary,), open(temporary, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


@contextlib.contextmanager
def directory_atomic(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path``
    (a link to a directory is followed: the directory is replaced, the link stays).

    On any error or interrupt the temporary directory is removed and ``path``
    is left as it was. The directory gets 0777 less the umask, not mkdtemp's 0700.
    """
    checked = check_new_directory(path, force)
    path = _resolved(checked) if checked.is_symlink() else checked
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        folder = _private_directory(path.parent, _temporary_prefix(path),
                                    f"writing directory {path.name}")
    except OSError as error:
        raise BytecompError(f"cannot write {path}: {error.strerror}") from None
    temporary = folder / _NEW
    try:
        temporary.mkdir()
        yield temporary
        os.chmod(temporary, 0o777 & ~_umask())
        if path.exists():
            # both renames inside one file system; a kill between them leaves the old
            # directory in the private folder, which the next run puts back
            os.replace(path, folder / _PREVIOUS)
        os.replace(temporary, path)
    finally:
        _remove_private(folder)


# -- scratch directories ---------------------------------------------------------------------
#
# What a run keeps only while it runs (a plan's finalist files, results from its ranks)
# lives under one private directory per user, ``$TMPDIR/bytecomp-<uid>/``, in a folder per
# run named ``<purpose>.<pid>.<random>.tmp`` with the marker. A run killed outright cannot
# remove its folder; the next run of any bytecomp command does (remove_stale_scratch).


def _scratch_root() -> Path | None:
    """``$TMPDIR/bytecomp-<uid>``, made 0700 if missing; None where it exists but is not
    provably this user's private directory (a link, another owner, open to others)."""
    root = Path(tempfile.gettempdir()) / f"bytecomp-{os.getuid()}"
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return root


def remove_stale_scratch() -> list[Path]:
    """Remove the scratch folders (see :func:`scratch_directory`) of runs whose process is
    gone; returns them. Cheap: one listing of the user's scratch root."""
    root = _scratch_root()
    removed: list[Path] = []
    if root is None:
        return removed
    pattern = re.compile(r"[a-z-]+\.(\d+)\.[A-Za-z0-9_]+\.tmp")
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or _alive(int(match.group(1))) or not _is_ours(entry, None):
            continue
        _remove_private(entry)
        removed.append(entry)
    return removed


@contextlib.contextmanager
def scratch_directory(purpose: str) -> Iterator[Path]:
    """A private folder for files that live only while this run does, removed when the
    block ends; if the run is killed outright, the next bytecomp run removes it.
    ``purpose``: lower-case letters and dashes (``finalists``), part of its name."""
    if not re.fullmatch(r"[a-z-]+", purpose):
        raise ValueError(f"scratch purpose {purpose!r}: lower-case letters and dashes")
    remove_stale_scratch()
    root = _scratch_root()
    try:
        if root is None:  # not ours to use: a folder of this run alone in the temp dir
            folder = Path(tempfile.mkdtemp(prefix=f"bytecomp-{purpose}-"))
        else:
            folder = _private_directory(root, f"{purpose}.{os.getpid()}.", purpose)
    except OSError as error:
        raise BytecompError(f"cannot make a scratch directory in {tempfile.gettempdir()}: "
                            f"{error.strerror}") from None
    try:
        yield folder
    finally:
        _remove_private(folder)
