"""One writer per run: a training process holds an exclusive lock on its workdir for its
whole life, so a job requeued while its first copy still runs stops at once instead of
writing the same checkpoints and metrics.

Two locks, both the kernel's `flock`:
- on the workdir itself, opened as a directory (process 0 of a run): nothing a user or a
  cleanup script deletes inside the workdir (`rm DIR/*.lock`) releases it, and a second
  trainer is refused however the lock file was removed, renamed or replaced;
- on DIR/train.lock (process P of a multi-host run: its own DIR/train.lock.P, as several
  processes of one run may share a machine and only process 0 locks the directory). The
  file records the holder (host, pid, start time) for the message of the process refused.
Where a directory cannot be locked (NFS may answer EBADF, ENOLCK or EINVAL), the file lock
alone is held; that is logged at INFO.

`WorkdirLock.check`, called before a run writes its logs and checkpoints, compares what is
held with what is on disk. A lock file removed or replaced while the directory lock is held
is recreated and locked again, with the holder record (the run is still the only writer). A
workdir moved, removed or replaced stops the run with a WorkdirGone naming the workdir (and
where the directory held is now), a new lock file that another process holds (where there is
no directory lock) with a WorkdirBusy.

A run writes its checkpoints through `WorkdirLock.anchor`, a path naming the directory it
holds wherever that now is (/proc/self/fd/N): orbax's asynchronous save in flight when the
workdir is moved or replaced goes on into the run's own directory, never into what now
stands at its path, and one under a removed workdir fails instead of making it again.

`take` refuses (ConfigError, before it writes anything) an empty workdir path, a path that is
or lies under a file, and an existing folder that holds files but is not a training run's:
an exported model (model.safetensors, export.json) or a folder of the user's, whose
config.json and metrics.jsonl a run would overwrite. A run's folder is one holding
train.lock (the first thing every run writes), spm_settings.json (`load_tokenizer` writes it
before a run trains) or checkpoints/ (runs written before the lock existed).

The kernel drops both locks when the holder exits, however it exits, so a lock left by a
killed process never blocks. Readers (eval, translate, export) take no lock. On file
systems that do not enforce `flock` across machines (some NFS set-ups) the locks still work
between processes of one machine; see docs/training.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import io
import json
import logging
import os
import pathlib
import socket

from seq2seq.data.pipeline import file_in_the_way
from seq2seq.errors import ConfigError, WorkdirBusy

LOCK_FILE = "train.lock"
RUN_FILES = (LOCK_FILE, "spm_settings.json")  # files only a training run (or its tokenizer) puts in a folder
EXPORT_FILES = ("export.json", "model.safetensors")  # what marks a `python -m seq2seq.export` folder
NOT_CONTENT = frozenset({"lost+found", ".DS_Store"})  # a fresh file system's, a file manager's: an empty folder
# What flock on a directory answers where the file system cannot lock one (NFS, some FUSE).
NO_DIRECTORY_LOCK = frozenset({errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP})
_log = logging.getLogger(__name__)


class WorkdirGone(WorkdirBusy):
  """The workdir a run holds was moved, removed or replaced while it trained: it stops, and
  writes nothing more there."""


def _is_run(entries: list[pathlib.Path]) -> bool:
  """Whether a folder's entries are a training run's: a lock file (DIR/train.lock, a process's
  DIR/train.lock.P, or one renamed train.lock.*), spm_settings.json, or checkpoints/."""
  return any(p.is_dir() if p.name == "checkpoints" else p.name.startswith(RUN_FILES) and not p.is_dir()
             for p in entries)


def check_workdir(workdir: str | os.PathLike) -> None:
  """Raises ConfigError, naming --workdir, where a run may not write: an empty path (an unset
  $VARIABLE would train in the current directory), a path that is or lies under a file, or an
  existing folder that holds files and is not a training run's (see the module docstring).
  An empty folder, a new path and a run's folder (to resume it) pass."""
  if not str(workdir).strip():
    raise ConfigError("--workdir is empty (an unset $VARIABLE?): give the folder the run writes its checkpoints, "
                      "metrics and tokenizer into, a new or empty one (or a run's, to resume it)")
  path = pathlib.Path(workdir)
  blocking = file_in_the_way(path)
  if blocking is not None:
    where = f"--workdir={workdir}" + ("" if blocking == path else f": {blocking}")
    raise ConfigError(f"{where} is a file, not a folder; choose a new or empty folder for --workdir")
  if not path.is_dir():
    return
  entries = sorted((p for p in path.iterdir() if p.name not in NOT_CONTENT), key=lambda p: p.name)
  if not entries or _is_run(entries):
    return
  names = [p.name + ("/" if p.is_dir() else "") for p in entries]
  held = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
  if any(p.name in EXPORT_FILES for p in entries):
    raise ConfigError(f"--workdir={workdir} is an exported model (it holds {held}), not a training run's folder: "
                      "training there would overwrite its config.json and the export would no longer load. Choose a "
                      "new or empty folder for --workdir")
  raise ConfigError(f"--workdir={workdir} is not empty and is not a training run's folder (it holds {held}): "
                    "training there would overwrite files such as config.json and metrics.jsonl. Choose a new or "
                    "empty folder for --workdir (a run's folder, to resume it)")


def lock_path(workdir: pathlib.Path, process_index: int = 0) -> pathlib.Path:
  return workdir / (LOCK_FILE if process_index == 0 else f"{LOCK_FILE}.{process_index}")


def _record(path: pathlib.Path) -> dict | None:
  try:
    h = json.loads(path.read_text(encoding="utf-8"))
    return h if {"pid", "host", "started"} <= h.keys() else None
  except (OSError, ValueError, AttributeError):
    return None


def flock_holders(st: os.stat_result) -> list[int]:
  """The pids of this machine's processes holding a `flock` on the file or directory of `st`
  (from /proc/locks; [] where there is none, or no /proc)."""
  try:
    lines = pathlib.Path("/proc/locks").read_text().splitlines()
  except OSError:
    return []
  exact = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
  # "N: FLOCK ADVISORY WRITE PID MAJOR:MINOR:INODE 0 EOF"; waiters ("N: -> FLOCK ...") are not holders, and a
  # holder in another pid namespace shows as pid 0.
  held = [f for f in map(str.split, lines) if len(f) >= 6 and f[1] == "FLOCK" and f[4].isdigit() and int(f[4])]
  pids = [int(f[4]) for f in held if f[5] == exact]
  # Stacked file systems (overlayfs) may number the device otherwise in /proc/locks than stat does.
  return pids or [int(f[4]) for f in held if f[5].rsplit(":", 1)[-1] == str(st.st_ino)]


def holder(path: pathlib.Path, directory: os.stat_result | None = None) -> str:
  """Who holds the lock, as recorded in `path` (host, pid, start time); where that record is
  gone or another's, the pid holding the locked `directory` on this machine."""
  record = _record(path)
  pids = flock_holders(directory) if directory is not None else []
  if record and (not pids or record["pid"] in pids):
    return f"pid {record['pid']} on host {record['host']}, started {record['started']}"
  if pids:
    return f"pid {pids[0]} on host {socket.gethostname()}; its lock file {path.name} was removed or replaced"
  return "a process that has not recorded itself yet"


def _busy(workdir: pathlib.Path, path: pathlib.Path, directory: os.stat_result | None = None) -> WorkdirBusy:
  return WorkdirBusy(f"{workdir} is in use by another training run ({holder(path, directory)}; lock {path}). Wait for "
                     "it to end, or stop it, before starting this one; or use another --workdir")


def _flock(fd) -> bool:
  """An exclusive flock on `fd` (a file or a descriptor) without waiting; False if another holds it."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return False
  return True


def _lock_directory(fd: int, workdir: pathlib.Path, path: pathlib.Path) -> bool:
  """Locks the workdir, open as `fd`; False where its file system cannot lock a directory."""
  try:
    if _flock(fd):
      return True
    raise _busy(workdir, path, os.fstat(fd))
  except OSError as err:
    if err.errno not in NO_DIRECTORY_LOCK:
      raise
    _log.info("%s: the file system does not lock directories (%s); the lock file %s alone keeps a second trainer "
              "out", workdir, os.strerror(err.errno), path)
    return False


def _id(st: os.stat_result) -> tuple[int, int]:
  return st.st_dev, st.st_ino


@dataclasses.dataclass
class WorkdirLock:
  """What a training process holds on its workdir (see the module docstring)."""
  workdir: pathlib.Path
  path: pathlib.Path  # DIR/train.lock, or DIR/train.lock.P
  record: dict  # host, pid, start time, command: what the lock file says
  file: io.TextIOWrapper | None = None  # the open, locked lock file
  directory_fd: int | None = None  # the workdir, open and locked (process 0, where the file system can)
  directory_id: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the workdir held
  open_fd: int | None = None  # the workdir, open (locked where directory_fd is set): what `anchor` names

  @property
  def anchor(self) -> pathlib.Path:
    """A path to the directory held wherever it is now (/proc/self/fd/N): writes through it never
    reach a folder put in its place, and fail once it is removed. Its path where there is no /proc."""
    fd_path = pathlib.Path(f"/proc/self/fd/{self.open_fd}")
    return fd_path if self.open_fd is not None and fd_path.is_dir() else self.workdir

  def _lock_file(self) -> None:
    """Opens (creating) and locks the lock file and writes the holder record into it."""
    f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open until release()
    if not _flock(f):
      f.close()
      raise _busy(self.workdir, self.path)
    if self.file is not None:
      self.file.close()
    self.file = f
    self._write_record()

  def _write_record(self) -> None:
    self.file.seek(0)
    self.file.truncate()
    self.file.write(json.dumps(self.record) + "\n")
    self.file.flush()

  def check(self, last_good: str | None) -> str | None:
    """Raises WorkdirGone if the workdir is no longer the one held, WorkdirBusy if (no directory
    lock) another process holds a new lock file; recreates a lock file removed, renamed or
    replaced meanwhile, returning a warning that says so (else None), and rewrites an edited
    record. `last_good`: the last good checkpoint, for the error (None: not known yet)."""
    stopped = "Training stopped" + (f"; the last good checkpoint is {last_good}" if last_good else "")
    try:
      now = _id(os.stat(self.workdir))
    except FileNotFoundError:
      now = None
    if now != self.directory_id:
      moved = ""
      with contextlib.suppress(OSError):
        target = os.readlink(f"/proc/self/fd/{self.open_fd}") if self.open_fd is not None else ""
        if target and target != str(self.workdir) and not target.endswith(" (deleted)"):
          moved = f" (the directory this run holds is now {target})"
      raise WorkdirGone(f"the workdir {self.workdir} was moved, removed or replaced while this run trained{moved}; "
                        f"it no longer writes there. {stopped}")
    try:
      same = _id(os.stat(self.path)) == _id(os.fstat(self.file.fileno()))
    except FileNotFoundError:
      same = False
    if same:  # the lock file held: its record rewritten if it was emptied or edited
      if _record(self.path) != self.record:
        self._write_record()
      return None
    try:
      self._lock_file()
    except WorkdirBusy:
      raise WorkdirBusy(f"{self.path} was replaced while this run trained, and another process holds it "
                        f"({holder(self.path)}): two runs may be writing {self.workdir}. {stopped}") from None
    return (f"warning: {self.path} was removed or replaced while this run trained; recreated it (this run still holds "
            f"{self.workdir})")

  def release(self) -> None:
    if self.file is not None:
      self.file.close()
    if self.open_fd is not None:
      os.close(self.open_fd)
      self.open_fd = self.directory_fd = None


@contextlib.contextmanager
def take(workdir: str | os.PathLike, process_index: int = 0, command: str = ""):
  """Holds the workdir's locks (creating the workdir) while the block runs, yielding the
  WorkdirLock; raises ConfigError for a workdir a run may not use (`check_workdir`), and
  WorkdirBusy naming the holder if another live process has the locks. If the block fails
  with nothing written into a workdir this call created, the workdir is removed again."""
  check_workdir(workdir)
  workdir = pathlib.Path(workdir)
  created = not workdir.exists()
  workdir.mkdir(parents=True, exist_ok=True)
  path = lock_path(workdir, process_index)
  record = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "command": command}
  held = WorkdirLock(workdir, path, record)
  try:
    held.open_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    if process_index == 0 and _lock_directory(held.open_fd, workdir, path):
      held.directory_fd = held.open_fd
    held.directory_id = _id(os.fstat(held.open_fd))
    held._lock_file()
    try:
      yield held
    except BaseException:
      # Each process removes its own lock file, then the workdir if it is empty: the processes of one
      # multi-host run on a shared filesystem fail and clean up at once (OSError: another one removed
      # the workdir first, or its lock file is still there).
      with contextlib.suppress(OSError):
        if created and all(p.name.startswith(LOCK_FILE) for p in workdir.iterdir()):
          path.unlink(missing_ok=True)
          workdir.rmdir()
      raise
  finally:
    held.release()  # releases the locks


@contextlib.contextmanager
def hold(workdir: str | os.PathLike, process_index: int = 0, command: str = ""):
  """`take`, yielding the lock file's path."""
  with take(workdir, process_index, command) as held:
    yield held.path
