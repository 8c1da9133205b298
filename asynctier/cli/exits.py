"""The exit status of every ``asynctier`` command, and the one error type commands raise.

Scripts and CI tell "the data is bad" from "the disk for the report was full" by the code,
so each outcome has its own number and the numbers never change meaning.
"""

from __future__ import annotations

from enum import IntEnum

import click

__all__ = ["EXIT_CODES_HELP", "CliError", "ExitCode"]


class ExitCode(IntEnum):
    """What a command's exit status means (the lowest that applies is returned)."""

    OK = 0
    #: A chunk failed or came back different (bench, selfcheck); bad chunks remain (fsck).
    NOT_VERIFIED = 1
    #: A usage or configuration error, found before any byte moved (click's own code for usage errors).
    USAGE = 2
    #: The run verified, but an output (--json, --markdown, --plot) could not be written.
    OUTPUT_FAILED = 3
    #: The command could not go on: an I/O error outside the chunk transfers (the root vanished, a
    #: tier could not open its medium), or no tier could run at all.
    CANNOT_RUN = 4
    #: Interrupted (Ctrl-C, SIGINT): 128 + the signal's number, as a shell reports it.
    INTERRUPTED = 130


#: The exit codes as ``--help`` shows them (``\b`` keeps click from rewrapping the lines).
EXIT_CODES_HELP = """\b
Exit status:
  0  every byte verified and every output written
  1  data did not verify (a chunk failed or came back different; fsck: bad chunks remain)
  2  usage or configuration error, found before any byte moved
  3  data verified, but an output file could not be written
  4  could not run (I/O error outside the chunk transfers, or no tier could run)
  130 interrupted (Ctrl-C)
  A reader that closes standard output early (| head) ends the command with 3, quietly."""


class CliError(click.ClickException):
    """A one-line error with its exit status (click prints ``Error: message``, no traceback)."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        # click declares exit_code a class variable; each error here carries its own
        setattr(self, "exit_code", int(code))  # noqa: B010
