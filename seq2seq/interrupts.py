"""Ctrl-C that Python would otherwise lose.

A KeyboardInterrupt raised while Python runs a garbage-collection callback or a `__del__`
cannot propagate: Python prints "Exception ignored in ..." and goes on. JAX registers such
a callback (`_xla_gc_callback`), so a Ctrl-C that landed there let a translation run to its
end and replace its output file. `install()` (the commands do it at start) records such an
interrupt instead of printing it, and `check()` raises it again where stopping is safe: between
batches (`Progress.update`) and before a file or folder is put in place (`files`).
"""

from __future__ import annotations

import sys

_pending = False
_previous = sys.unraisablehook  # what reports every other unraisable exception


def _hook(unraisable) -> None:
  global _pending
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    _pending = True
  else:
    _previous(unraisable)


def install() -> None:
  """Records the KeyboardInterrupts Python would only print (sys.unraisablehook)."""
  global _previous
  if sys.unraisablehook is not _hook:
    _previous, sys.unraisablehook = sys.unraisablehook, _hook


def check() -> None:
  """Raises KeyboardInterrupt if one was lost since the last check."""
  global _pending
  if _pending:
    _pending = False
    raise KeyboardInterrupt
