"""Writing files so that a crash leaves the old content or the new, never a torn file, and
the checksum every stage uses to tell whether a file is intact."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import tempfile


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, suffix: str = ".tmp"):
  """A binary file object that replaces `path` (through a rename) when the block ends
  without an error; on an error `path` is untouched and the temporary file removed."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
  try:
    with os.fdopen(fd, "wb") as f:
      yield f
    os.replace(tmp, path)
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
