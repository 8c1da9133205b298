"""The ``asynctier`` command group: the commands, ``--version``, the exit codes in ``--help``."""

from __future__ import annotations

import click

from .bench.command import bench
from .exits import EXIT_CODES_HELP
from .fsck import fsck
from .info import info
from .selfcheck import selfcheck

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="asynctier")
def main() -> None:
    """asynctier: move KV-cache chunks between a primary buffer and storage tiers, from asyncio."""


for _command in (info, selfcheck, bench, fsck):
    main.add_command(_command)
del _command
