"""The ``rlx`` command line: one module per command family.

``commands`` holds the typer app, ``main`` and the small commands (``run``, ``bench``,
``cache``, ``version``); ``devices``, ``check``, ``calibrate`` and ``batch`` each register
their command on it; ``common`` is what they share (the console, error handling, the
phase spinner, graph files); ``bench_worker`` is the child process ``rlx bench`` times
in. Imports of the runtime happen inside the commands, so ``rlx --help`` stays quick.
"""

from .commands import EXAMPLES, app, main

__all__ = ["app", "main", "EXAMPLES"]
