"""``python -m asynctier.cli``: the ``asynctier`` command."""

from __future__ import annotations

import os
import sys

# ``python -m`` puts the current directory first on the import path; the console script does
# not. Tier configs name modules to import (module_path), so a directory is searched only
# when the user names it (--path DIR): both ways of running agree.
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .main import main

main()
