"""The failures a user can fix, as one class hierarchy. The commands print any `Error` as one
line `error: MESSAGE` and exit with status 2 (seq2seq/cli.py); every other exception is a
bug and keeps its traceback (exit status 1). Messages name the file, config key or URL.

  Error
  ├── ConfigError       a setting: config.KEY, a flag, a config file that does not load
  ├── DataError         input data: a corpus file, a token cache, a test set
  │   └── DownloadError no network, or a URL that failed
  ├── CheckpointError   no usable checkpoint (damaged, missing, of another run)
  ├── ModelFileError    an exported model folder that is damaged or altered
  ├── ResourceError     the environment: disk full, permissions, file-size limits, a path through a file
  ├── WorkdirBusy       another training process holds the run's workdir
  └── TrainingDiverged  training went non-finite more often than the guard rolls back

The ones about values are also ValueErrors, ResourceError an OSError and TrainingDiverged
a RuntimeError, so `except ValueError` (OSError, RuntimeError) catches them too.
"""

from __future__ import annotations

import errno
import os


def command(name: str) -> str:
  """How this user runs the command `name` (train, eval), for hints in messages: `python
  eval.py` when this process is one of the clone's scripts (train.py, eval.py), else the
  console command (`seq2seq-eval`), which works from any directory: also after `python -m
  seq2seq.export`, whose module path names no script of the clone."""
  import pathlib
  import sys

  started_as = pathlib.Path(sys.argv[0] if sys.argv else "")
  if started_as.name in ("train.py", "eval.py") and started_as.resolve().parent.name not in ("commands", "seq2seq"):
    return f"python {name}.py"
  return f"seq2seq-{name}"


class Error(Exception):
  """A failure the user can fix; its message names what to fix."""


class ConfigError(Error, ValueError):
  """A setting that cannot work (config.KEY, a command-line flag, a config file)."""


class DataError(Error, ValueError):
  """Bad input data; the message names the file (and line) at fault."""


class DownloadError(DataError):
  """A download failed: no network, or the URL did not answer as expected."""


class CheckpointError(Error, ValueError):
  """No usable checkpoint: the one asked for, or every one, is damaged or missing."""


class IdentityError(CheckpointError):
  """A checkpoint of another run: its model, vocabulary or data differ from the config's."""


class ModelFileError(Error, ValueError):
  """An exported model folder whose files are missing, damaged or altered since the export."""


class ResourceError(Error, OSError):
  """The environment refused: disk full, a quota or file-size limit, no permission."""

  def __str__(self) -> str:
    return self.strerror or super().__str__()


class WorkdirBusy(Error):
  """Another live training process holds the workdir's lock."""


class TrainingDiverged(Error, RuntimeError):
  """Training went non-finite (or spiked) more often than the divergence guard may roll back."""


# OSErrors that are the environment's, not a bug: they become ResourceErrors at the commands' edge.
# A path through a file (ENOTDIR), a file where a folder is made (EEXIST) or a folder where a file is written
# (EISDIR) is a path the user gave or made: named the same way.
RESOURCE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS,
                             errno.EMFILE, errno.ENFILE, errno.ENOTDIR, errno.EEXIST, errno.EISDIR})


def from_os_error(err: OSError, doing: str = "") -> ResourceError | None:
  """The ResourceError an OSError of the environment stands for (naming its file), or None."""
  if err.errno not in RESOURCE_ERRNOS:
    return None
  names = " -> ".join(str(f) for f in (err.filename, err.filename2) if f)
  what = os.strerror(err.errno) if err.errno else str(err)
  return ResourceError(err.errno, f"{names + ': ' if names else ''}{what}" + (f" ({doing})" if doing else ""))
