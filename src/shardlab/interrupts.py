"""How a driver with a job to stop turns SIGINT, SIGTERM and SIGHUP into its clean-up (``shardlab run``'s launcher).

- ``signals_raise``: while a job runs, the signals raise ``Interrupted`` in the main thread, so the driver's
  ``finally`` blocks stop the job (``shardlab.proctree``) before it exits; each signal is also recorded in a
  ``Caught``, because Python drops an exception raised while a finaliser runs, and a wait must not miss it.
- ``shielded``: while cleaning up, further signals are ignored (a second Ctrl-C must not cut the clean-up short).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP received by a driver that has a job to stop (``signum`` says which)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum



class Caught:
    """The last signal a ``signals_raise`` handler received (None: none yet)."""

    signum: int | None = None


@contextmanager
def signals_raise(signums=(signal.SIGTERM, signal.SIGHUP, signal.SIGINT)):
    """While active, the signals raise ``Interrupted`` in the main thread (no-op in other threads); yields a
    ``Caught`` that also records the signal, because an exception raised while the main thread runs a finaliser
    (``__del__``) is printed and dropped by Python: a waiting loop checks ``Caught.signum`` and raises itself.
    SIGINT is taken only where Python's own Ctrl-C handler is installed (a process started with SIGINT ignored,
    such as a background job of a non-interactive shell, keeps ignoring it)."""
    import threading

    caught = Caught()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum, frame):
        caught.signum = signum
        raise Interrupted(signum)
    old = {}
    for s in signums:
        if s == signal.SIGINT and signal.getsignal(s) is not signal.default_int_handler:
            continue
        old[s] = signal.signal(s, handler)
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def shielded(signums=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
    """While cleaning up, ignore further SIGINT/SIGTERM/SIGHUP (a second Ctrl-C must not cut the clean-up
    short); no-op outside the main thread."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
