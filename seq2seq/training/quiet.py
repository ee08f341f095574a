"""Library noise to the log: a training run reports a failure of its writes once, as its own
error line (a failed save: seq2seq/training/checkpoint.py), so what orbax, tensorstore and
tensorboardX log or print about the same failure (their tracebacks, from threads and
callbacks, often dozens) goes to the log at INFO, where `--log_level=INFO` shows it, not to
the user's terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings

LIBRARIES = ("orbax", "tensorstore", "tensorboardX")  # whose failures the run reports itself
_log = logging.getLogger(__name__)
_installed = False
thread_errors: dict[threading.Thread, BaseException] = {}  # what ended each library thread that failed


class _LibraryErrorsToInfo(logging.Filter):
  """Orbax's logged errors and asyncio's (orbax's tasks: "exception was never retrieved"), at INFO."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR and (record.name == "asyncio" or f"{os.sep}orbax{os.sep}" in record.pathname):
      record.levelno, record.levelname = logging.INFO, "INFO"
      return logging.getLogger(record.name).isEnabledFor(logging.INFO)
    return True


def _of_library(thing) -> bool:
  return (getattr(thing, "__module__", None) or "").split(".")[0] in LIBRARIES


def library_errors_to_log() -> None:
  """For the rest of this process (a training run): the errors orbax logs with their
  tracebacks, and exceptions ignored in orbax's, tensorstore's and tensorboardX's threads and
  callbacks (a write that failed after orbax closed its event loop, tensorboardX's exit hook
  on a full disk), go to the log at INFO (`--log_level=INFO` shows them), not to the
  terminal: the run reports each such failure once, as its own error."""
  global _installed
  if _installed:
    return
  _installed = True
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_LibraryErrorsToInfo())
  unraisable, thread_hook = sys.unraisablehook, threading.excepthook

  def quiet_unraisable(u) -> None:
    late = u.object is None and isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value)
    if not (late or _of_library(u.object)):
      return unraisable(u)
    _log.info("ignored in a library callback (%s)", u.err_msg or u.object, exc_info=(u.exc_type, u.exc_value,
                                                                                     u.exc_traceback))

  def quiet_thread(args) -> None:
    if not _of_library(type(args.thread)):
      return thread_hook(args)
    thread_errors[args.thread] = args.exc_value  # seq2seq.metrics reports a dead TensorBoard writer with it
    _log.info("a library thread failed (%s)", args.thread, exc_info=(args.exc_type, args.exc_value,
                                                                     args.exc_traceback))

  sys.unraisablehook, threading.excepthook = quiet_unraisable, quiet_thread
  # seq2seq has no coroutines: those never awaited are orbax's writes abandoned after a failed
  # save (reported already), warned about when the interpreter collects them, often at exit.
  warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
