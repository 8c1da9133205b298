"""The ``asynctier`` command group: the commands, ``--version``, the exit codes in ``--help``."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from .bench.command import bench
from .exits import EXIT_CODES_HELP, ExitCode
from .fsck import fsck
from .info import info
from .selfcheck import selfcheck

__all__ = ["main"]


class _Commands(click.Group):
    """Two ends every command shares, each with its own exit status: click's own is 1 for
    both, which here says the data did not verify."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.Abort):
            click.echo("\ninterrupted", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        except BrokenPipeError:  # the reader closed stdout (| head): files were written first
            _stdout_to_devnull()
            sys.exit(ExitCode.OUTPUT_FAILED)


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's last flush at exit does
    not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="asynctier")
def main() -> None:
    """asynctier: move KV-cache chunks between a primary buffer and storage tiers, from asyncio."""


for _command in (info, selfcheck, bench, fsck):
    main.add_command(_command)
del _command
