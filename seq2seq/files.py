"""Writing files so that a crash leaves the old content or the new, never a torn file, and
the checksum every stage uses to tell whether a file is intact. What is written gets the
modes the user's umask gives any new file (0644 and folders 0755 under umask 022), not
the private 0600 of a temporary file: colleagues on a shared cluster can read a run."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pathlib
import shutil
import tempfile

OWNER_SUFFIX = ".owner"
_log = logging.getLogger(__name__)


def umask() -> int:
  """The process's umask, read without changing it where Linux says it (/proc/self/status)."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but only where /proc has no Umask)
  os.umask(mask)
  return mask


def file_mode() -> int:
  """The mode `open()` gives a new file: 0o666 less the umask."""
  return 0o666 & ~umask()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, suffix: str = ".tmp"):
  """A binary file object that replaces `path` (through a rename) when the block ends
  without an error; on an error `path` is untouched and the temporary file removed."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
  try:
    try:
      os.fchmod(fd, file_mode())  # mkstemp's 0600 would stay with the file once renamed
      with os.fdopen(fd, "wb") as f:
        yield f
      os.replace(tmp, path)
    except OSError as err:  # a failed write names no file: name the one being written
      if err.filename is None and err.errno:
        raise type(err)(err.errno, err.strerror, str(path)) from err
      raise
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
  """Writes `data` (str as UTF-8) to `path`: all or nothing."""
  with atomic_open(path) as f:
    f.write(data.encode("utf-8") if isinstance(data, str) else data)


def file_sha256(path: str | os.PathLike) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


@contextlib.contextmanager
def staging_dir(parent: str | os.PathLike, name: str):
  """A new folder PARENT/.NAME.XXXX to build something in and rename into place, owned by
  this process while the block runs: a lock (flock) on the sibling file .NAME.XXXX.owner.
  The folder, unless renamed away, and the owner file are removed when the block ends. A
  process killed inside the block leaves both; `remove_stale` removes them later."""
  parent = pathlib.Path(parent)
  parent.mkdir(parents=True, exist_ok=True)
  fd, path = tempfile.mkstemp(dir=parent, prefix=f".{name}.", suffix=OWNER_SUFFIX)  # owned before the folder exists
  owner = pathlib.Path(path)
  folder = owner.with_name(owner.name.removesuffix(OWNER_SUFFIX))
  with os.fdopen(fd, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    folder.mkdir()
    try:
      yield folder
    finally:
      if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
      owner.unlink(missing_ok=True)


def remove_stale(parent: str | os.PathLike) -> list[pathlib.Path]:
  """Removes the staging folders in `parent` (see `staging_dir`) whose owner process is gone:
  their owner file is not locked. Returns the folders removed."""
  parent = pathlib.Path(parent)
  removed = []
  for owner in sorted(parent.glob(f".*{OWNER_SUFFIX}")) if parent.is_dir() else []:
    try:
      with open(owner, "r+") as lock:
        try:
          fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          continue  # a live process is building it
        folder = owner.with_name(owner.name.removesuffix(OWNER_SUFFIX))
        if folder.exists():
          shutil.rmtree(folder, ignore_errors=True)
          removed.append(folder)
        owner.unlink(missing_ok=True)
    except FileNotFoundError:
      continue  # its owner finished meanwhile
  if removed:
    _log.warning("removed %d folder(s) left by killed processes: %s", len(removed), ", ".join(map(str, removed)))
  return removed
