"""The hostile corpus's size: at the end of any run that collected tests/hostile/, one
line per case class (a file here) with its cases run and how they ended, and the total."""

from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath

_outcomes: dict[str, Counter] = {}


def pytest_runtest_logreport(report) -> None:
    path = PurePosixPath(report.nodeid.split("::")[0])  # relative to the root: tests/hostile/
    ended = report.when == "call" or (report.when == "setup" and not report.passed)
    if path.parent.name != "hostile" or not ended:
        return
    _outcomes.setdefault(path.stem, Counter())[report.outcome] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _outcomes:
        return
    terminalreporter.write_sep("-", "hostile corpus")
    total: Counter = Counter()
    for name in sorted(_outcomes):
        counts = _outcomes[name]
        total += counts
        terminalreporter.write_line(f"{name}: {sum(counts.values())} cases ("
                                    + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                                    + ")")
    terminalreporter.write_line(f"hostile corpus: {sum(total.values())} cases run in "
                                f"{len(_outcomes)} classes")
