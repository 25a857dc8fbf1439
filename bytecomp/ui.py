"""Terminal output shared by the commands: rich progress bars on rank 0 only, and tables
that keep their names whole at any width (:class:`Fitted`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.status import Status
from rich.table import Table

console = Console()
errors = Console(stderr=True)  # notes, warnings and, beside a JSON document, progress


def announce(text: str) -> None:
    """A long stage's opening line on stderr: what it does, how long, how to skip it."""
    errors.print(escape(text), highlight=False, soft_wrap=True)


def warn(warning: str) -> None:
    """A warning on stderr, one line however narrow the terminal."""
    errors.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False,
                 soft_wrap=True)


class Fitted:
    """``table`` as printed, its words whole wherever the width allows: narrower than the
    table's natural width (80 columns, piped, in a CI log), every column narrows to its
    longest word (headers wrap), values then names get the room left (``keep``: the
    columns of names, strategies or compressors), and the outer frame and edge padding
    go before a word would be cut. A word wider than its column folds onto the next
    line: no cell is ever cut with an ellipsis."""

    def __init__(self, table: Table, keep: Iterable[int] = (0,)) -> None:
        self.table = table
        self.keep = set(keep)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        fit(self.table, console, options, self.keep)
        yield self.table


def fit(table: Table, console: Console, options: ConsoleOptions, keep: set[int]) -> None:
    """Set ``table``'s column widths for ``options.max_width`` (see :class:`Fitted`)."""
    width = options.max_width
    wide = options.update_width(1 << 20)  # what a renderable takes, unclamped

    def measure(renderable) -> Measurement:
        return Measurement.get(console, wide, renderable)

    if measure(table).maximum <= width:
        return  # as it is: nothing wraps

    word, values, whole = [], [], []  # per column: its longest word, value and line
    for column in table.columns:
        header, cells = measure(column.header), [measure(cell) for cell in column.cells]
        word.append(max([header.minimum, *(cell.minimum for cell in cells)]))
        values.append(max([0, *(cell.maximum for cell in cells)]))
        whole.append(max(header.maximum, values[-1]))
    for column in table.columns:
        column.overflow, column.no_wrap = "fold", False
    edge, pad_edge, collapse = table.show_edge, table.pad_edge, table.collapse_padding
    for compact in range(3):  # lose the frame, then the padding at the edges and between
        table.show_edge, table.pad_edge = edge and compact == 0, pad_edge and compact == 0
        table.collapse_padding = collapse or compact == 2
        room = width - table._extra_width - sum(  # rich's own accounting of borders and padding
            table._get_padding_width(index) for index in range(len(table.columns)))
        if sum(word) <= room:
            break
    else:
        return  # narrower than the longest words: rich shares the width out, words fold
    widths, spare = list(word), room - sum(word)
    others = [index for index in range(len(widths)) if index not in keep]
    for order, target in ((others, values), (sorted(keep), whole), (range(len(widths)), whole)):
        for index in order:
            if index < len(widths):
                extra = min(spare, max(0, target[index] - widths[index]))
                widths[index] += extra
                spare -= extra
    for column, column_width in zip(table.columns, widths):
        column.width = column_width


def _ignore(steps: int = 1, total: int | None = None) -> None:
    """``advance`` when no progress is shown."""


HEARTBEAT_S = 30.0  # piped, a phase that runs longer prints a line at least this often
OVER_ALLOWANCE = 1.2  # a phase this far past its allowed time says so


def seconds(value: float) -> str:
    """``value`` seconds as a phase's line shows them: whole from 10 s, else a tenth."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


class Reporter:
    """What a long command is doing, on stderr, from rank 0 only (``enabled``): a
    progress bar with the time elapsed and left per phase on a terminal; piped (a CI log)
    or beside a JSON document, one line per phase and no bar, then a line at least every
    :data:`HEARTBEAT_S` seconds while it runs (its steps so far), the total again where
    the phase learns it late, and at its end the time it took against the time it was
    allowed. Results go to stdout (:meth:`print`), except beside a JSON document
    (``to_stderr``), which holds them."""

    def __init__(self, enabled: bool = True, to_stderr: bool = False) -> None:
        self.enabled = enabled
        # to_stderr: stdout holds a JSON document, so results are not printed
        self.to_stderr = to_stderr
        self._progress: Progress | None = None
        self._lines = False  # piped: a line per phase instead of bars
        self._began: list[tuple[str, float]] = []  # each phase's name and start
        # the current phase: its allowed seconds, advice when it overruns, steps done/total
        self._allowed: dict[str, tuple[float, str]] = {}
        self._done, self._total = 0, 0
        self._said = 0.0  # when a piped line was last printed
        self._stop = threading.Event()
        if enabled and errors.is_terminal:
            from bytecomp.lifetime import take_terminal

            take_terminal()  # a spawned rank 0: the parent's spinner clears first

    @contextlib.contextmanager
    def session(self) -> Iterator[Reporter]:
        if not self.enabled:
            yield self
            return
        if not errors.is_terminal:
            self._lines = True
            self._stop.clear()
            beat = threading.Thread(target=self._heartbeat, daemon=True)
            beat.start()
            try:
                yield self
                self._end_phase()
            finally:
                self._stop.set()
                beat.join()
                self._lines = False
            return
        self._progress = Progress(TextColumn("{task.description:<28}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("left"), TimeRemainingColumn(),
                                  console=errors, transient=False)
        with self._progress:
            yield self
            self._end_phase()
        self._progress = None

    def _say(self, text: str) -> None:
        self._said = time.perf_counter()
        errors.print(escape(text), highlight=False, soft_wrap=True)

    def _heartbeat(self) -> None:
        """Piped: the current phase's steps so far, when nothing was said for a while."""
        while not self._stop.wait(min(1.0, HEARTBEAT_S / 4)):
            if self._began and self._began[-1][0] and \
                    time.perf_counter() - self._said >= HEARTBEAT_S:
                name, start = self._began[-1]
                allowed = self._allowed.get(name)
                self._say(f"  {name}: {self._done:,} of {self._total:,} steps, "
                          f"{seconds(time.perf_counter() - start)}"
                          + (f" of {seconds(allowed[0])} allowed" if allowed else ""))

    def end_phase(self) -> None:
        """End the current phase now (the next one, or the session's end, would too)."""
        if self.enabled:
            self._end_phase()
            self._began.append(("", time.perf_counter()))  # nothing runs until the next

    def _end_phase(self) -> None:
        """The phase that ends now: piped, its time against what it was allowed; a
        warning (both ways) where it took more than :data:`OVER_ALLOWANCE` times that."""
        if not self._began or not self._began[-1][0]:
            return
        name, start = self._began[-1]
        spent = time.perf_counter() - start
        allowed = self._allowed.get(name)
        if self._lines and allowed:
            self._say(f"  {name}: {seconds(spent)} of {seconds(allowed[0])} allowed")
        if allowed and spent > OVER_ALLOWANCE * allowed[0]:
            self.warn(f"{name} took {seconds(spent)} of the {seconds(allowed[0])} it is allowed"
                      + (f": {allowed[1]}" if allowed[1] else ""))

    def phase(self, description: str, total: int, allowed_s: float | None = None,
              more: str = "", most: bool = False) -> Callable[..., None]:
        """Start a phase of ``total`` steps; return ``advance(steps=1, total=None)``
        (``total``: the phase's new length, where it is known only once started).
        ``allowed_s``: the time it may take (its share of a budget), shown beside it and
        against what it took; ``more``: what gives it more, said if it overruns;
        ``most``: ``total`` is only the most it may take (the time decides)."""
        if self.enabled:
            self._end_phase()
        self._began.append((description, time.perf_counter()))
        self._done, self._total = 0, total
        if allowed_s is not None:
            self._allowed[description] = (allowed_s, more)
        if self._lines:
            limit = f", at most {seconds(allowed_s)}" if allowed_s is not None else ""
            self._say(f"{description}: {'at most ' if most else ''}{total:,} steps{limit}")

            def count(steps: int = 1, total: int | None = None) -> None:
                if total is not None and total != self._total:
                    self._total = total
                    self._say(f"  {description}: {total:,} steps, as the time allows")
                self._done += steps

            return count
        if self._progress is None:
            return _ignore
        progress = self._progress
        task = progress.add_task(description, total=max(total, 1))

        def advance(steps: int = 1, total: int | None = None) -> None:
            if total is not None:
                progress.update(task, total=max(total, 1))
            progress.advance(task, steps)
            self._done += steps

        return advance

    def durations(self) -> dict[str, float]:
        """Seconds from each phase's start to the next's (the last: to now), by name."""
        marks = [*self._began, ("", time.perf_counter())]
        return {name: round(end - start, 3) for (name, start), (_, end) in
                zip(marks, marks[1:]) if name}

    def line(self, text: str) -> None:
        """A stage's opening line (what it does, about how long, how to skip it), on
        stderr, above any bar."""
        if self.enabled:
            (self._progress.console if self._progress else errors).print(
                escape(text), highlight=False, soft_wrap=True)

    def print(self, *objects) -> None:
        """Results, on stdout (nothing where ``to_stderr``: a JSON document holds them)."""
        if self.enabled and not self.to_stderr:
            console.print(*objects)

    def warn(self, text: str) -> None:
        """A warning, on stderr, one line."""
        if self.enabled:
            errors.print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False,
                         soft_wrap=True)


class Stage:
    """A stage that prints nothing while it works, made visible: ``with Stage("searching
    ..."):``. On a terminal, a spinner with the text appears once the stage has run
    ``after_s`` seconds (by default at once: a stage may hold the interpreter, a
    solver's or an import's C code, so that a timer could not fire until it ends);
    piped, the text is printed as one line on stderr once it has run ``lines_after_s``
    seconds (with ``lines``; a stage whose work prints its own lines passes
    ``lines=False``).
    :meth:`end` clears it early (before another display takes the terminal)."""

    def __init__(self, text: str, after_s: float = 0.0, lines: bool = True,
                 enabled: bool = True, lines_after_s: float = 2.0) -> None:
        self.text, self.lines, self.enabled = text, lines, enabled
        self.after_s = after_s if errors.is_terminal else lines_after_s
        self._status: Status | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._ended = False

    def __enter__(self) -> Stage:
        if self.enabled and self.after_s <= 0 and errors.is_terminal:
            self._show()  # now: the work may hold the interpreter (an import of torch)
        elif self.enabled and (errors.is_terminal or self.lines):
            self._timer = threading.Timer(self.after_s, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _show(self) -> None:
        with self._lock:
            if self._ended:
                return
            if errors.is_terminal:
                status = errors.status(escape(self.text), spinner="dots")
                status.start()
                self._status = status
            else:
                errors.print(escape(self.text), highlight=False, soft_wrap=True)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            if self._timer is not None:
                self._timer.cancel()
            if self._status is not None:
                self._status.stop()
                self._status = None

    def __exit__(self, *exc) -> None:
        self.end()
