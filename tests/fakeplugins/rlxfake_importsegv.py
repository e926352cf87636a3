"""A plugin whose import kills its process with SIGSEGV, as an extension module built for
another CPU does: imported in rlx's own process it would end every command with status
139 and nothing naming it. rlx must find that out in a child process, once."""

import os
import signal

os.kill(os.getpid(), signal.SIGSEGV)
