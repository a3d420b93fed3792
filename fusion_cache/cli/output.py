"""Tables and progress: rich on a terminal; plain columns and whole lines otherwise, so a
log or a pipe gets neither colour codes nor the carriage returns a redrawn line needs.
rich is imported only on a terminal (Note [No torch in the CLI's modules]: the plain path
costs nothing to import)."""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                right: Sequence[str] = (), stream: TextIO | None = None) -> None:  # fmt: skip
    """Columns named in `right` are right-aligned (numbers)."""
    stream = stream or sys.stdout
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, header_style="bold", pad_edge=False)
        for h in headers:
            table.add_column(h, justify="right" if h in right else "left", overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(file=stream).print(table)
        return
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(cells, widths, headers)]
        return "  ".join(parts).rstrip()

    print(line(headers), file=stream)
    for row in rows:
        print(line(row), file=stream)


class Status:
    """A status that changes as work goes on: a rich spinner line on a terminal, else one
    plain line per update (for logs)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._progress = None
        self._task = None

    def __enter__(self) -> Status:
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      TimeElapsedColumn(), console=Console(file=self.stream),
                                      transient=False)  # fmt: skip
            self._progress.start()
            self._task = self._progress.add_task("starting", total=None)
        return self

    def update(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        else:
            print(text, file=self.stream, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
