"""A plugin whose import never finishes, as one waiting on a dead network mount or a lock
does: imported in rlx's own process it would hang every command."""

import threading

threading.Event().wait()
