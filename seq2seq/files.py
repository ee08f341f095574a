"""Writing files so that a crash leaves the old content or the new, never a torn file, and
the checksum every stage uses to tell whether a file is intact. What is written gets the
modes the user's umask gives any new file (0644 and folders 0755 under umask 022), not
the private 0600 of a temporary file: colleagues on a shared cluster can read a run.

Folders are built in a staging folder beside their target (`staging_dir`) and put in place
by `swap_in`: one atomic exchange on Linux (renameat2 RENAME_EXCHANGE), elsewhere two
renames through a backup that `remove_stale` puts back should a process be killed between
them. At every moment the old folder or the new one is whole at the target, or (only
between the two renames) in the backup that the next `remove_stale` restores.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import io
import logging
import os
import pathlib
import shutil
import stat
import sys
import tempfile

from seq2seq import interrupts

OWNER_SUFFIX = ".owner"
BACKUP_SUFFIX = ".old"  # PARENT/.NAME.XXXX.old: the target moved aside by swap_in's two-rename fallback
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
      interrupts.check()  # a Ctrl-C that Python lost (seq2seq/interrupts.py) keeps the old file
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


@contextlib.contextmanager
def output_file(path: str | os.PathLike):
  """A binary file object for a command's output file (`--output`): a regular file, or a new
  one, is replaced whole when the block ends without an error (through a rename, at the
  target of a symbolic link, which stays); anything else a rename would replace (a device
  such as /dev/null, a named pipe, /dev/fd/N from `>(command)`) is written to as it is."""
  try:
    special = not stat.S_ISREG(os.stat(path).st_mode)  # follows links
  except FileNotFoundError:  # new (or a dangling link: its target is created)
    special = False
  with (open(path, "wb") if special else atomic_open(os.path.realpath(path))) as f:
    yield f


def write_output(path: str | os.PathLike, data: bytes) -> None:
  """`data` into a command's output file, as `output_file` writes it."""
  with output_file(path) as f:
    f.write(data)


def write_stdout(text: str) -> None:
  """`text` on stdout, every byte or an OSError naming stdout: a full disk under `> FILE` is
  an error, not a file cut short with exit status 0 (a short write is retried, and the
  retry fails)."""
  sys.stdout.flush()
  try:
    fd = sys.stdout.fileno()
  except (AttributeError, io.UnsupportedOperation):  # a stream in memory (tests, notebooks)
    sys.stdout.write(text)
    sys.stdout.flush()
    return
  view = memoryview(text.encode("utf-8"))
  while view:
    try:
      view = view[os.write(fd, view):]
    except BlockingIOError:
      continue
    except OSError as err:
      if isinstance(err, BrokenPipeError):
        raise
      raise OSError(err.errno, err.strerror, "stdout") from None


def file_sha256(path: str | os.PathLike) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


@contextlib.contextmanager
def staging_dir(parent: str | os.PathLike, name: str):
  """A new folder PARENT/.NAME.XXXX to build something in and rename into place, owned by
  this process while the block runs: a lock (flock) on the sibling file .NAME.XXXX.owner,
  which records NAME (so that `remove_stale` knows the target of a backup). The folder,
  unless renamed away, and the owner file are removed when the block ends. A process
  killed inside the block leaves both; `remove_stale` removes them later."""
  parent = pathlib.Path(parent)
  parent.mkdir(parents=True, exist_ok=True)
  fd, path = tempfile.mkstemp(dir=parent, prefix=f".{name}.", suffix=OWNER_SUFFIX)  # owned before the folder exists
  owner = pathlib.Path(path)
  folder = owner.with_name(owner.name.removesuffix(OWNER_SUFFIX))
  with os.fdopen(fd, "wb") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write(os.fsencode(name))
    lock.flush()
    folder.mkdir()
    try:
      yield folder
    finally:
      if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
      if not os.path.lexists(folder.with_name(folder.name + BACKUP_SUFFIX)):  # else remove_stale restores it
        owner.unlink(missing_ok=True)


def step(name: str) -> None:
  """Marks a named point of a multi-step replacement (`swap_in`, seq2seq.export); does nothing.
  Tests replace it to stop a process there and kill it (tests/test_probes_export.py)."""


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
  """Swaps the paths a and b in one atomic step (Linux renameat2 with RENAME_EXCHANGE, glibc
  >= 2.28); False where that is not available (no such symbol, kernel or filesystem)."""
  renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
  if renameat2 is None:  # macOS, musl, an older glibc
    return False
  renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
  at_fdcwd, rename_exchange = -100, 2
  if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a filesystem (NFS) or kernel without it
    return False
  raise OSError(code, os.strerror(code), str(a), None, str(b))


def swap_in(staging: pathlib.Path, target: pathlib.Path) -> None:
  """Puts the folder `staging` (of a `staging_dir` block) at `target`, in the same folder;
  what was at `target` ends up at `staging`, which the block then removes. Linux: one atomic
  exchange. Elsewhere: target -> the backup STAGING.old, staging -> target, backup ->
  staging; a process killed between the first two renames leaves target missing and the old
  folder in the backup, which `remove_stale` puts back."""
  interrupts.check()
  step("swap")
  if not os.path.lexists(target):
    os.rename(staging, target)
    return
  if _exchange(staging, target):
    step("exchanged")
    return
  backup = staging.with_name(staging.name + BACKUP_SUFFIX)
  os.rename(target, backup)
  step("aside")
  try:
    os.rename(staging, target)
  except OSError:
    os.rename(backup, target)
    raise
  step("moved")
  os.rename(backup, staging)


def remove_stale(parent: str | os.PathLike) -> list[pathlib.Path]:
  """Removes the staging folders in `parent` (see `staging_dir`) whose owner process is gone:
  their owner file is not locked. A backup of `swap_in` is put back at its target where that
  is missing (the process was killed between the two renames), else removed; a backup whose
  owner file does not name its target is left alone. Returns the folders removed."""
  parent = pathlib.Path(parent)
  removed = []
  for owner in sorted(parent.glob(f".*{OWNER_SUFFIX}")) if parent.is_dir() else []:
    try:
      with open(owner, "r+b") as lock:
        try:
          fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          continue  # a live process is building it
        folder = owner.with_name(owner.name.removesuffix(OWNER_SUFFIX))
        _restore(folder, os.fsdecode(lock.read()))
        if folder.exists():
          shutil.rmtree(folder, ignore_errors=True)
          removed.append(folder)
        if not os.path.lexists(folder.with_name(folder.name + BACKUP_SUFFIX)):
          owner.unlink(missing_ok=True)
    except FileNotFoundError:
      continue  # its owner finished meanwhile
  if removed:
    _log.warning("removed %d folder(s) left by killed processes: %s", len(removed), ", ".join(map(str, removed)))
  return removed


def _restore(folder: pathlib.Path, name: str) -> None:
  """The backup of a killed `swap_in` (FOLDER.old): renamed back to its target PARENT/NAME
  where that is missing, else removed (the swap was done). Kept where NAME is unknown."""
  backup = folder.with_name(folder.name + BACKUP_SUFFIX)
  if not backup.is_dir() or not name or "/" in name or name in (".", ".."):
    return
  target = folder.parent / name
  if os.path.lexists(target):
    shutil.rmtree(backup, ignore_errors=True)
  else:
    os.rename(backup, target)
    _log.warning("put %s back from %s, left by a process killed while replacing it", target, backup)
