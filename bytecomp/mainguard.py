"""The main-module guard spawned ranks need: ``multiprocessing``'s spawn starts each rank
as a new interpreter that runs the script which started it again (as ``__mp_main__``),
so a script that calls ``bytecomp.profile`` (or ``plan`` or ``bench``) at its top level,
outside ``if __name__ == "__main__":``, would have every rank call it again, and
multiprocessing refuse that inside the rank with a traceback the parent reports as a rank
that exited with code 1. :func:`check_main_guard` finds that case before anything is
spawned and says, in one line, what to add. ``torch.multiprocessing.spawn`` has the same
rule.

This module imports only the standard library: it runs before torch loads.
"""

from __future__ import annotations

import ast
import os
import sys
import tokenize
import types

from bytecomp.errors import BytecompError


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def guarded(source: str, line: int) -> bool:
    """Whether ``line`` of ``source`` is inside the body of an ``if __name__ ==
    "__main__":`` (at any depth). Source that does not parse counts as guarded: nothing
    is refused on a guess."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if any(stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)
                   for stmt in node.body):
                return True
    return False


def rerun_main() -> str | None:
    """The file spawned processes would run again as their main module (what
    ``multiprocessing.spawn.get_preparation_data`` hands them), or None: a package's
    ``__main__`` (``python -m pkg``), an interactive session, ``-c`` or a notebook."""
    main = sys.modules.get("__main__")
    if main is None:
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    if name is None and os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None  # multiprocessing leaves IPython's launcher alone
    return path


def check_main_guard() -> None:
    """One line where this call comes from a script's top-level code outside ``if
    __name__ == "__main__":`` and ranks are about to be spawned (see the module
    docstring); nothing otherwise (a call from a function the guard calls, from a
    thread, from a notebook or ``python -m pkg``)."""
    path = rerun_main()
    if path is None:
        return
    main = sys.modules["__main__"]
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main)
                                     and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return
    line = frame.f_lineno
    try:
        with tokenize.open(path) as file:
            source = file.read()
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    if guarded(source, line):
        return
    shown = os.path.basename(path)
    raise BytecompError(f"{shown}, line {line}: bytecomp starts its ranks with "
                        f"multiprocessing's spawn, which runs {shown} again in each of them: "
                        f"put the code that calls bytecomp under "
                        f"`if __name__ == \"__main__\":`")


def check_before_spawning() -> None:
    """:func:`check_main_guard`, unless this process is a rank of a torchrun job (which
    spawns nothing): what :func:`bytecomp.profile`, :func:`bytecomp.plan` and
    :func:`bytecomp.bench` call first, so that the line comes at once."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    check_main_guard()
