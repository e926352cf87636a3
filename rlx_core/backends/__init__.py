"""Backends: finding plugins, probing them safely, remembering what they said.

``registry.py`` discovers the ``rlx.backends`` entry points and holds each backend;
``plugin_import.py`` imports a plugin for the first time in a child process; ``probing.py``
runs a probe (in a child when isolation is on) and ``probe_verdicts.py`` keeps its answer
on disk; ``isolation.py`` is the child-process machinery (``_isolated_child.py`` its child
side); ``faults.py`` remembers devices whose calibration crashed. The contract a backend
implements is ``rlx_core.plugin``, one level up: plugins import that, never this package.
"""
