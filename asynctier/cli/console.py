"""The rich consoles the commands print to, sized for where the output goes."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["PIPE_WIDTH", "output_console", "progress_console"]

#: Width of tables written to a file or a pipe when COLUMNS does not say: wide enough that no
#: column of the bench tables is dropped (a log keeps every figure).
PIPE_WIDTH = 200


def output_console() -> Any:
    """A console for results on stdout: the terminal's width, COLUMNS when set, else :data:`PIPE_WIDTH`."""
    from rich.console import Console

    class _Output(Console):
        def on_broken_pipe(self) -> None:
            # rich exits with 1 (here: the data did not verify); the command group says 3
            raise BrokenPipeError

    console = _Output()
    columns = os.environ.get("COLUMNS", "")
    if not console.is_terminal and not columns.isdigit():
        console = _Output(width=PIPE_WIDTH)
    return console


def progress_console() -> Any:
    """A console for the plan and the progress bar: stderr, so stdout holds only the results."""
    from rich.console import Console

    return Console(stderr=True)
