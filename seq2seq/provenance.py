"""What a training run ran: DIR/commands.txt gets each start's command line, and
DIR/provenance.jsonl one JSON line per start or restart with the command, the seq2seq version,
the git commit of the source it ran from (and whether that source had changes), Python's and
the libraries' versions, and the devices. A result can then name the code that made it."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import pathlib
import platform
import subprocess

LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "sacrebleu")
FILE = "provenance.jsonl"


def source_commit(root: str | pathlib.Path | None = None) -> tuple[str | None, bool | None]:
  """(commit, has changes) of the git checkout `root` (by default the one holding this
  package), else (None, None): an installed copy, or no git."""
  root = pathlib.Path(root) if root else pathlib.Path(__file__).resolve().parent.parent
  if not (root / ".git").exists():
    return None, None
  try:
    git = lambda *args: subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,  # noqa: E731
                                       timeout=30, check=True).stdout
    return git("rev-parse", "HEAD").strip(), bool(git("status", "--porcelain", "--untracked-files=no").strip())
  except (OSError, subprocess.SubprocessError):
    return None, None


def _version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def record(command: str, devices: str) -> dict:
  from seq2seq import __version__

  commit, changed = source_commit()
  return {"command": command, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "seq2seq": __version__, "commit": commit, "changes": changed, "python": platform.python_version(),
          "libraries": {name: _version(name) for name in LIBRARIES}, "devices": devices}


def append(workdir: str | pathlib.Path, command: str, devices: str) -> None:
  """Adds this start's command to DIR/commands.txt and its record to DIR/provenance.jsonl."""
  workdir = pathlib.Path(workdir)
  with open(workdir / "commands.txt", "a", encoding="utf-8") as f:
    f.write(command + "\n")
  with open(workdir / FILE, "a", encoding="utf-8") as f:
    f.write(json.dumps(record(command, devices)) + "\n")


def commit_of(workdir: str | pathlib.Path) -> str:
  """The commits a run's starts ran from, short, joined by "," when a restart ran other code,
  with "+changes" where the source had uncommitted changes; "" when none is recorded."""
  path = pathlib.Path(workdir) / FILE
  if not path.is_file():
    return ""
  seen = []
  for line in path.read_text(encoding="utf-8").splitlines():
    entry = json.loads(line) if line.strip() else {}
    if entry.get("commit"):
      name = entry["commit"][:7] + ("+changes" if entry.get("changes") else "")
      seen += [name] if name not in seen else []
  return ",".join(seen)
