"""The one-line refusal, checked the same way by every test of bad input.

A refused command prints one ``error: ...`` line and exits non-zero, with no traceback.
Before it, a stage that ran past its ``lines_after_s`` (two seconds, piped) may have printed
its progress line ("building ... and checking its recipe"): on a loaded machine a refusal
that takes 1.5 s quietly takes 2.5 s, so a progress line is allowed, an error or a warning
line is not.
"""

from __future__ import annotations

import subprocess


def refusal_lines(stderr: str, ignore: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """(the progress lines, the error line) of a refusal's stderr; asserts its shape.
    ``ignore``: fragments of lines that are neither (a library's own warning)."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines()
             if line.strip() and not any(fragment in line for fragment in ignore)]
    assert lines and lines[-1].startswith("error: "), stderr
    progress = lines[:-1]
    for line in progress:
        assert not line.lower().startswith(("error", "warning")) and "Warning" not in line, \
            stderr
    return progress, lines[-1]


def one_line_error(result: subprocess.CompletedProcess, *fragments: str, code: int = 2,
                   ignore: tuple[str, ...] = ()) -> str:
    """The error line of a refused command, after checking its exit code, that it is the
    only error line and that it holds every fragment."""
    assert result.returncode == code, (result.returncode, result.stdout[-2000:],
                                       result.stderr[-3000:])
    _, line = refusal_lines(result.stderr, ignore)
    for fragment in fragments:
        assert fragment in line, line
    return line
