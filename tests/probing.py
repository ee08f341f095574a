"""What the probe suites (tests/test_probes_*.py) share: a command run as a user runs it, the
check that a user's mistake ends in one `error:` line (exit 2, no traceback), and a record of
every file under some folders, to show that nothing outside a command's own output changed."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys

from conftest import REPO


def command(module: str, *args: str, cwd=REPO, stdin: str | bytes = "", env=None,
            timeout: float = 600) -> subprocess.CompletedProcess:
  """`python -m MODULE ARGS...` in `cwd`, its stdout and stderr as text."""
  raw = isinstance(stdin, bytes)
  out = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, input=stdin, capture_output=True,
                       text=not raw, timeout=timeout, env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})
  if raw:
    out.stdout, out.stderr = out.stdout.decode("utf-8", "replace"), out.stderr.decode("utf-8", "replace")
  return out


def one_error_line(out: subprocess.CompletedProcess, pattern: str) -> None:
  """Exit status 2, no traceback, and the last line of stderr the only `error:` line, matching `pattern`."""
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  lines = out.stderr.rstrip("\n").splitlines()
  assert [line for line in lines if line.startswith("error: ")] == lines[-1:], out.stderr[-3000:]
  assert re.search(pattern, lines[-1]), (pattern, lines[-1])


def no_traceback(out: subprocess.CompletedProcess) -> None:
  assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
  assert "Traceback" not in out.stderr and "error:" not in out.stderr, out.stderr[-3000:]


def snapshot(*folders) -> dict[str, tuple[int, str]]:
  """{path: (mode, sha256)} of every file and folder under `folders`: equal before and after a
  command when it removed, added and changed nothing there."""
  seen = {}
  for folder in folders:
    for path in sorted(pathlib.Path(folder).rglob("*")):
      if path.is_file() and not path.is_symlink():
        seen[str(path)] = (path.stat().st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
      else:
        seen[str(path)] = (path.lstat().st_mode, "")
  return seen
