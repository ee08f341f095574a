"""One writer per run: a training process holds an exclusive lock on its workdir for its
whole life, so a job requeued while its first copy still runs stops at once instead of
writing the same checkpoints and metrics.

The lock is the kernel's `flock` on DIR/train.lock (process P of a multi-host run: its own
DIR/train.lock.P). The kernel drops it when the holder exits, however it exits, so a lock
left by a killed process never blocks. The file records the holder (host, pid, start
time) for the error message of the process refused. Readers (eval, translate, export) take
no lock. On file systems that do not enforce `flock` across machines (some NFS set-ups)
the lock still works between processes of one machine; see docs/training.md.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import socket

from seq2seq.errors import WorkdirBusy

LOCK_FILE = "train.lock"


def lock_path(workdir: pathlib.Path, process_index: int = 0) -> pathlib.Path:
  return workdir / (LOCK_FILE if process_index == 0 else f"{LOCK_FILE}.{process_index}")


def holder(path: pathlib.Path) -> str:
  """Who holds the lock in `path`, as recorded there (host, pid, start time)."""
  try:
    h = json.loads(path.read_text(encoding="utf-8"))
    return f"pid {h['pid']} on host {h['host']}, started {h['started']}"
  except (OSError, ValueError, KeyError, TypeError):
    return "a process that has not recorded itself yet"


@contextlib.contextmanager
def hold(workdir: str | os.PathLike, process_index: int = 0, command: str = ""):
  """Holds the workdir's lock (creating the workdir) while the block runs; raises WorkdirBusy
  naming the holder if another live process has it. If the block fails with nothing
  written into a workdir this call created, the workdir is removed again."""
  workdir = pathlib.Path(workdir)
  created = not workdir.exists()
  workdir.mkdir(parents=True, exist_ok=True)
  path = lock_path(workdir, process_index)
  f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the block
  try:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise WorkdirBusy(f"{workdir} is in use by another training run ({holder(path)}; lock {path}). Wait for it "
                        "to end, or stop it, before starting this one; or use another --workdir") from None
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "command": command}
    f.seek(0)
    f.truncate()
    f.write(json.dumps(record) + "\n")
    f.flush()
    try:
      yield path
    except BaseException:
      if created and all(p.name.startswith(LOCK_FILE) for p in workdir.iterdir()):
        for p in workdir.iterdir():
          p.unlink()
        workdir.rmdir()
      raise
  finally:
    f.close()  # releases the lock
