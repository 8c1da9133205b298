"""The ``asynctier`` command line (``asynctier info | selfcheck | bench | fsck``) and the bench
code behind it. Nothing in ``import asynctier`` imports this package.

Modules: :mod:`.main` (the command group), :mod:`.info`, :mod:`.selfcheck`, :mod:`.fsck`,
:mod:`.bench` (the bench subpackage), :mod:`.benchkit` (fio, the naive loop and the helpers
the scripts in ``bench/`` import), :mod:`.tierfile` (TOML tier files and the rules for
configs from the command line), :mod:`.sizes`, :mod:`.roots`, :mod:`.options`,
:mod:`.console`, :mod:`.exits` (exit codes).
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
