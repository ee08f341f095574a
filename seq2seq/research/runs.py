"""The runs of a sweep as shell commands (seq2seq/research/sweep.py, and the length study's
seq2seq/research/positions.py): one training run per (variant, size, seed) in DIR/NAME,
`seq2seq-train ... && EVALUATION`, planned from a config and the variants' overrides, listed
in DIR/sweep.json, run one after another with this Python, resumed where they stopped.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import pathlib
import shlex
import signal
import subprocess
import sys

from seq2seq.errors import ConfigError
from seq2seq.files import write_atomic
from seq2seq.research import ablations, variants

MANIFEST = "sweep.json"


@dataclasses.dataclass(frozen=True)
class Run:
  name: str  # the sub-directory: variant[@size]-sSEED
  variant: str
  size: str
  seed: int
  train: tuple[str, ...]  # seq2seq-train's arguments
  splits: tuple[str, ...]  # the test sets eval writes, as file-name stems
  steps: int
  # The splits eval translates (--split): the validation split first, then the test sets, so
  # that the records hold validation BLEU and chrF (the figures a choice may use). Empty: the
  # config's test sets alone, as sweeps did before 2026-11-28.
  evaluated: tuple[str, ...] = ()

  def workdir(self, root: pathlib.Path) -> pathlib.Path:
    return root / self.name

  def commands(self, root: pathlib.Path) -> list[list[str]]:
    workdir = str(self.workdir(root))
    return [["seq2seq-train", *self.train, f"--workdir={workdir}"],
            ["seq2seq-eval", f"--workdir={workdir}", *(f"--split={s}" for s in self.evaluated)]]

  def shell(self, root: pathlib.Path) -> str:
    return " && ".join(shlex.join(c) for c in self.commands(root))

  def trained(self, root: pathlib.Path) -> bool:
    return (self.workdir(root) / "checkpoints" / str(self.steps)).is_dir()

  def finished(self, root: pathlib.Path) -> bool:
    """Trained and evaluated at the last step on every test set."""
    from seq2seq.inference import evaluate  # here, not above: the research commands' --help needs no JAX

    evaluated = self.workdir(root) / "eval"
    return self.trained(root) and all(evaluate.saved_results(evaluated, split, f"step{self.steps}")
                                      for split in self.splits)


def user_overrides(argv: list[str]) -> list[str]:
  """The --config.KEY=VALUE flags of the command line, in order."""
  out = []
  for arg in argv:
    if arg.startswith("--config."):
      if "=" not in arg:
        raise ConfigError(f"write {arg} as {arg}=VALUE: the sweep passes overrides on to each run")
      out.append(arg)
  return out


def plan(config, config_arg: str, overrides: list[str], names: list[str], sizes: list[str], seeds: int) -> list[Run]:
  """The runs of a sweep, in order: seeds outermost, so a sweep cut short has every variant
  of the first seed."""
  if seeds < 1:
    raise ConfigError(f"--seeds must be >= 1, got {seeds}")
  for name in names:
    try:
      variants.parts(name)
    except ValueError as e:
      raise ConfigError(f"--variants: {e}") from None
  from seq2seq.inference import evaluate

  model = config.model.to_dict()
  splits = tuple(evaluate.result_name(s) for s in config.data.test_splits)
  evaluated = tuple(dict.fromkeys((config.data.validation_split, *config.data.test_splits)))
  runs = []
  for i in range(seeds):
    seed = config.seed + i
    for size in sizes:
      for name in names:
        changes = variants.overrides(name, model, config.data.vocab_size, size)
        changes |= variants.learning_rate(name, size, config.train.learning_rate)
        mine = {f"--config.{k}" for k in changes} | {"--config.seed"}
        kept = [o for o in overrides if o.split("=", 1)[0] not in mine]  # the variant's settings win
        train = (f"--config={config_arg}", *kept, *(variants.flag(k, v) for k, v in changes.items()),
                 f"--config.seed={seed}")
        label = name if size == "base" else f"{name}@{size}"
        runs.append(Run(f"{label}-s{seed}", name, size, seed, train, splits, config.train.steps, evaluated))
  return runs


def write_manifest(root: pathlib.Path, runs: list[Run], command: str) -> None:
  """DIR/sweep.json: every run and sweep command so far (earlier sweeps' are kept)."""
  path = root / MANIFEST
  old = json.loads(path.read_text()) if path.is_file() else {"runs": [], "sweeps": []}
  known = {r["name"]: r for r in old["runs"]}
  sweeps = [c for c in dict.fromkeys(map(ablations.canonical, old.get("sweeps", []))) if c != command] + [command]
  for run in runs:
    known[run.name] = {"name": run.name, "variant": run.variant, "size": run.size, "seed": run.seed,
                       "command": run.shell(root)}
  write_atomic(path, json.dumps({"runs": list(known.values()), "sweeps": sweeps}, indent=1) + "\n")


def _die_with_parent() -> None:
  """In the child: SIGKILL when the sweep dies (Linux), so a killed sweep leaves no run
  training on in the background while a rerun resumes it."""
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def execute(run: Run, root: pathlib.Path) -> int:
  """Trains (resuming) and evaluates one run with this Python; its exit status. A command
  `python -m MODULE ...` (the length study's evaluation) runs as it is."""
  modules = {"seq2seq-train": "seq2seq.commands.train", "seq2seq-eval": "seq2seq.commands.eval"}
  for command in run.commands(root):
    if command[0] == "seq2seq-train" and run.trained(root):
      continue
    argv = command[1:] if command[0] == "python" else ["-m", modules[command[0]], *command[1:]]
    status = subprocess.run([sys.executable, *argv], preexec_fn=_die_with_parent).returncode
    if status:
      return status
  return 0


def run_all(runs: list[Run], root: pathlib.Path) -> list[str]:
  """Runs each unfinished run in turn (finished ones are skipped); the names of those that failed."""
  failed = []
  for i, run in enumerate(runs, 1):
    if run.finished(root):
      print(f"[{i}/{len(runs)}] {run.name}: finished already", flush=True)
      continue
    print(f"[{i}/{len(runs)}] {run.name}: {run.shell(root)}", flush=True)
    if execute(run, root):
      failed.append(run.name)
  return failed
