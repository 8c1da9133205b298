"""The JSON file the bench scripts that print a table of rows write with ``--json``.

Kept here, beside the scripts, rather than in ``asynctier.cli.benchkit``: these scripts also
measure older checkouts (``PYTHONPATH=that/checkout``), whose package lacks anything added
to it since.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def write_rows(path: str | None, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Write the run's options, its rows and the Python that ran it to ``path`` (None: nothing)."""
    if path:
        with open(path, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "python": sys.version.split()[0]}, f, indent=1)
