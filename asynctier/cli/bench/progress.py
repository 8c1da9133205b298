"""Progress of a bench run: the runner says which phase runs and how many bytes are done; the
command shows it as a rich bar with an ETA (or not at all with ``-q``)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol

__all__ = ["BarProgress", "NoProgress", "Progress"]


class Progress(Protocol):
    """What the runner reports while it runs."""

    def phase(self, description: str) -> None:
        """The step now running (``fs 2 MiB depth 4: load``)."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` of the plan's total are done (moved, or skipped after a failure)."""


class NoProgress:
    """Reports go nowhere (``-q``, and callers of :func:`~.runner.run_bench` that pass none)."""

    def phase(self, description: str) -> None:
        """Ignored."""

    def advance(self, nbytes: int) -> None:
        """Ignored."""


class BarProgress:
    """A rich bar on stderr: the phase running, bytes done of the plan's total, elapsed time
    and an ETA from this run's own rate. Transient: it leaves no lines behind."""

    def __init__(self, total_bytes: int, console: Any) -> None:
        from rich import progress as rp
        from rich.table import Column

        self._bar = rp.Progress(
            rp.SpinnerColumn(),
            # the phase gives way first on a narrow terminal; the figures stay whole
            rp.TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=3)),
            rp.BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
            rp.DownloadColumn(binary_units=True),
            rp.TimeElapsedColumn(),
            rp.TextColumn("ETA"),
            rp.TimeRemainingColumn(),
            console=console,
            transient=True,
            expand=True,
        )
        self._task = self._bar.add_task("starting", total=max(1, total_bytes))

    def __enter__(self) -> BarProgress:
        self._bar.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.stop()

    def phase(self, description: str) -> None:
        """Show the step now running."""
        self._bar.update(self._task, description=description)

    def advance(self, nbytes: int) -> None:
        """Move the bar by ``nbytes``."""
        if nbytes > 0:
            self._bar.advance(self._task, nbytes)
