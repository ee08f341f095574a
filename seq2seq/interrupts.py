"""Ctrl-C that Python would otherwise lose.

A KeyboardInterrupt raised while Python runs a garbage-collection callback or a `__del__`
cannot propagate: Python prints "Exception ignored in ..." and goes on. JAX registers such
a callback (`_xla_gc_callback`), so a Ctrl-C that landed there let a translation run to its
end and replace its output file. Nor can one raised while native code runs a Python callback
that swallows its error (seen on CI: a translation interrupted while its programs compiled
ran to its end and exited 0). `install()` (the commands do it at start) records every Ctrl-C
as it arrives, in its own SIGINT handler, before raising KeyboardInterrupt as Python's does,
and records those Python would only print; `check()` raises a recorded one again where
stopping is safe: between batches (`Progress.update`) and before a file or folder is put in
place (`files`). `clear()` forgets one that was handled (Ctrl-C ending an interactive session).
"""

from __future__ import annotations

import signal
import sys
import threading

_pending = False
_previous = sys.unraisablehook  # what reports every other unraisable exception


def _hook(unraisable) -> None:
  global _pending
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    _pending = True
  else:
    _previous(unraisable)


def _on_sigint(signum, frame) -> None:
  global _pending
  _pending = True  # kept where the KeyboardInterrupt below is swallowed
  raise KeyboardInterrupt


def install() -> None:
  """Records every Ctrl-C (a SIGINT handler, in the main thread, where Python's default one is
  set) and the KeyboardInterrupts Python would only print (sys.unraisablehook)."""
  global _previous
  if sys.unraisablehook is not _hook:
    _previous, sys.unraisablehook = sys.unraisablehook, _hook
  if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_sigint)


def clear() -> None:
  """Forgets a recorded Ctrl-C that the caller has handled."""
  global _pending
  _pending = False


def check() -> None:
  """Raises KeyboardInterrupt if one was lost since the last check."""
  global _pending
  if _pending:
    _pending = False
    raise KeyboardInterrupt
