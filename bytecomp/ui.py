"""Terminal output shared by the commands: rich progress bars on rank 0 only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console()



def _ignore(steps: int = 1) -> None:
    """``advance`` when no progress is shown."""


class Reporter:
    """Progress bars, one per phase; silent where ``enabled`` is false (ranks > 0)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None

    @contextlib.contextmanager
    def session(self) -> Iterator[Reporter]:
        if not self.enabled:
            yield self
            return
        self._progress = Progress(TextColumn("{task.description:<28}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                  transient=False)
        with self._progress:
            yield self
        self._progress = None

    def phase(self, description: str, total: int) -> Callable[[int], None]:
        """Start a phase of ``total`` steps; return ``advance(steps=1)``."""
        if self._progress is None:
            return _ignore
        progress = self._progress
        task = progress.add_task(description, total=max(total, 1))

        def advance(steps: int = 1) -> None:
            progress.advance(task, steps)

        return advance

    def print(self, *objects) -> None:
        if self.enabled:
            console.print(*objects)
