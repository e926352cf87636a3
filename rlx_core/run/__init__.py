"""Where graphs compile and run: sessions, fallback, the runtime's state.

``session.py`` is ``compile`` (auto placement, fallback, partition) and ``GraphDevices``;
``runtime.py`` the ``Runtime`` that owns a registry and a policy; ``fallback.py`` the one
loop that tries devices in turn; ``drift.py`` re-picks a device that got slower;
``settings.py`` the table of every ``RLX_*`` variable; ``verify.py`` checks the cost
ranking against measured times. The public names are re-exported from ``rlx_core``.
"""
